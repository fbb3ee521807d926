"""A small HTTP server that speaks sglang's native `/generate` protocol, backed by `HFPolicy`.

This is NOT sglang. It exists because sglang's server is CUDA-only: it lets the `SGLangPolicy`
client be tested over real HTTP on CPU machines, and serves the tiny policy to anything that
speaks sglang's format. Endpoints: `POST /generate`, `GET /health`, `POST /update_weights_from_disk`,
`POST /flush_cache`. Responses follow sglang's documented shapes (`output_ids`, `text`,
`meta_info.output_token_logprobs` as `[logprob, token_id, null]`, `meta_info.finish_reason`).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from toolgym.harness.policy import SamplingParams


class ProtocolServer:
    """Serve an `HFPolicy` on 127.0.0.1 in a background thread; `url` says where."""

    def __init__(self, policy: Any, port: int = 0, fail_first: int = 0) -> None:
        self.policy = policy
        self.lock = threading.Lock()
        self.fail_first = fail_first  # answer the first N /generate calls with HTTP 503 (retry tests)
        self.requests: list[dict[str, Any]] = []
        self.weight_updates: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path in ("/health", "/health_generate"):
                    self._send(200, {})
                else:
                    self._send(404, {"error": f"no route {self.path}"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    self._send(400, {"error": "body is not JSON"})
                    return
                if self.path == "/generate":
                    self._generate(body)
                elif self.path == "/update_weights_from_disk":
                    server.weight_updates.append(body.get("model_path", ""))
                    ok = server._reload(body.get("model_path", ""))
                    self._send(200, {"success": ok, "message": "ok" if ok else "cannot load weights"})
                elif self.path == "/flush_cache":
                    self._send(200, {})
                else:
                    self._send(404, {"error": f"no route {self.path}"})

            def _generate(self, body: dict[str, Any]) -> None:
                server.requests.append(body)
                if server.fail_first > 0:
                    server.fail_first -= 1
                    self._send(503, {"error": "warming up"})
                    return
                ids, sp = body.get("input_ids"), body.get("sampling_params") or {}
                if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
                    self._send(400, {"error": "input_ids must be a non-empty list of ints"})
                    return
                sampling = SamplingParams(
                    max_new_tokens=sp.get("max_new_tokens", 128), temperature=sp.get("temperature", 1.0),
                    top_p=sp.get("top_p", 1.0), top_k=max(0, sp.get("top_k", 0) or 0),
                    stop_token_ids=tuple(sp.get("stop_token_ids") or ()), seed=sp.get("sampling_seed"))
                with server.lock:
                    gen = server.policy.generate_batch([ids], [sampling])[0]
                text = server.policy.tokenizer.decode(gen.token_ids, skip_special_tokens=False)
                meta = {"prompt_tokens": len(ids), "completion_tokens": len(gen.token_ids),
                        "finish_reason": {"type": gen.finish_reason},
                        "output_token_logprobs": [[lp, t, None] for lp, t in zip(gen.logprobs, gen.token_ids)]}
                self._send(200, {"text": text, "output_ids": gen.token_ids, "meta_info": meta})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def _reload(self, path: str) -> bool:
        from transformers import AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(path)
        except Exception:
            return False
        with self.lock:
            self.policy.model.load_state_dict(model.state_dict())
        return True

    def __enter__(self) -> "ProtocolServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving and release the port."""
        self.httpd.shutdown()
        self.httpd.server_close()
