"""Integrations: toolgym seen from other tools.

The OpenAI-compatible training endpoint (`endpoint`), environments served over MCP (`mcp_server`),
suites as Hugging Face datasets (`datasets`) and TRL's `environment_factory` (`trl_adapter`).

May import every layer below it (`trainers`, `harness`, `inference`, `envs`, `verifiers`, ...).
"""
