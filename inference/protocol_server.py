"""A small HTTP server that speaks sglang's native protocol, backed by `HFPolicy`.

This is NOT sglang. It exists because sglang's server is CUDA-only: it lets the `SGLangPolicy`
client be tested over real HTTP on CPU machines, and serves the tiny policy to anything that
speaks sglang's format. Endpoints, with sglang's request and response shapes:

- `POST /generate` (`output_ids`, `text`, `meta_info.output_token_logprobs` as
  `[logprob, token_id, null]`, `meta_info.finish_reason`, `meta_info.weight_version`);
- `GET /health`, `GET /get_model_info` (with `weight_version`);
- `POST /pause_generation`, `POST /continue_generation` (while paused, new generations wait);
- `POST /update_weights_from_disk`, `POST /flush_cache`;
- `POST /init_weights_update_group`, `POST /update_weights_from_distributed`,
  `POST /destroy_weights_update_group` (a real torch.distributed group; see `harness.weight_sync`).

Run one as its own process (what the failover and weight-group tests do):

    python -m toolgym.inference.protocol_server MODEL_DIR [--port N] [--delay-ms MS]

It prints `listening on URL` once it serves. `--delay-ms` holds every generation that long
(a slow accelerator), so a test can take a server down while turns are in flight.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from toolgym.inference.policy import SamplingParams

# transformers' from_pretrained sets process-wide state while it loads (empty-weight init): two
# servers in threads of one process (the tests) must not load at once.
_LOAD_LOCK = threading.Lock()


class ProtocolServer:
    """Serve an `HFPolicy` on 127.0.0.1 in a background thread; `url` says where."""

    def __init__(self, policy: Any, port: int = 0, fail_first: int = 0, delay_s: float = 0.0) -> None:
        self.policy = policy
        self.lock = threading.Lock()
        self.fail_first = fail_first  # answer the first N /generate calls with HTTP 503 (retry tests)
        self.delay_s = delay_s
        self.requests: list[dict[str, Any]] = []
        self.weight_updates: list[str] = []
        #: Control calls in arrival order (pause, update, continue...): tests check the order.
        self.calls: list[str] = []
        self.weight_version = "default"
        self.running = threading.Event()
        self.running.set()
        self.groups: dict[str, Any] = {}
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
                elif self.path == "/get_model_info":
                    self._send(
                        200,
                        {
                            "model_path": getattr(server.policy, "source", None),
                            "is_generation": True,
                            "weight_version": server.weight_version,
                        },
                    )
                else:
                    self._send(404, {"error": f"no route {self.path}"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}") or {}
                except json.JSONDecodeError:
                    self._send(400, {"error": "body is not JSON"})
                    return
                if self.path == "/generate":
                    self._generate(body)
                    return
                routes = {
                    "/update_weights_from_disk": server._update_from_disk,
                    "/flush_cache": lambda b: {"success": True},
                    "/pause_generation": server._pause,
                    "/continue_generation": server._continue,
                    "/init_weights_update_group": server._init_group,
                    "/update_weights_from_distributed": server._update_from_group,
                    "/destroy_weights_update_group": server._destroy_group,
                }
                if self.path not in routes:
                    self._send(404, {"error": f"no route {self.path}"})
                    return
                server.calls.append(self.path.lstrip("/"))
                self._send(200, routes[self.path](body))

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
                    max_new_tokens=sp.get("max_new_tokens", 128),
                    temperature=sp.get("temperature", 1.0),
                    top_p=sp.get("top_p", 1.0),
                    top_k=max(0, sp.get("top_k", 0) or 0),
                    stop_token_ids=tuple(sp.get("stop_token_ids") or ()),
                    seed=sp.get("sampling_seed"),
                )
                server.running.wait()  # paused for a weight update: wait for /continue_generation
                time.sleep(server.delay_s)
                with server.lock:
                    gen = server.policy.generate_batch([ids], [sampling])[0]
                    version = server.weight_version
                text = server.policy.tokenizer.decode(gen.token_ids, skip_special_tokens=False)
                meta = {
                    "prompt_tokens": len(ids),
                    "completion_tokens": len(gen.token_ids),
                    "finish_reason": {"type": gen.finish_reason},
                    "weight_version": version,
                    "output_token_logprobs": [[lp, t, None] for lp, t in zip(gen.logprobs, gen.token_ids)],
                }
                self._send(200, {"text": text, "output_ids": gen.token_ids, "meta_info": meta})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    # ---- control endpoints (each returns the JSON reply) ------------------------------------------

    def _pause(self, body: dict[str, Any]) -> dict[str, Any]:
        self.running.clear()
        return {"success": True, "message": f"paused ({body.get('mode', 'abort')})"}

    def _continue(self, body: dict[str, Any]) -> dict[str, Any]:
        self.running.set()
        return {"success": True, "message": "continued"}

    def _set_version(self, body: dict[str, Any]) -> None:
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])

    def _update_from_disk(self, body: dict[str, Any]) -> dict[str, Any]:
        from transformers import AutoModelForCausalLM

        path = body.get("model_path", "")
        self.weight_updates.append(path)
        try:
            with _LOAD_LOCK:
                state = AutoModelForCausalLM.from_pretrained(path).state_dict()
        except Exception as err:
            return {"success": False, "message": f"cannot load weights from {path!r}: {type(err).__name__}"}
        with self.lock:
            self.policy.model.load_state_dict(state)
            self._set_version(body)
        return {"success": True, "message": "ok"}

    def _init_group(self, body: dict[str, Any]) -> dict[str, Any]:
        from toolgym.inference.weight_sync import join_weight_group

        try:
            self.groups[body["group_name"]] = join_weight_group(
                body.get("backend", "gloo"),
                body["master_address"],
                int(body["master_port"]),
                int(body["world_size"]),
                int(body["rank_offset"]),
                body["group_name"],
                timeout_s=60,
            )
        except Exception as err:
            return {"success": False, "message": f"cannot join the group: {type(err).__name__}: {err}"}
        return {"success": True, "message": "joined"}

    def _update_from_group(self, body: dict[str, Any]) -> dict[str, Any]:
        group = self.groups.get(body.get("group_name", ""))
        if group is None:
            return {"success": False, "message": f"no weight update group {body.get('group_name')!r}"}
        received = {}
        for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"]):
            t = torch.empty(shape, dtype=getattr(torch, dtype))
            torch.distributed.broadcast(t, src=0, group=group)
            received[name] = t
        with self.lock:
            missing = set(self.policy.model.state_dict()) - set(received)
            self.policy.model.load_state_dict(received, strict=not missing)
            self._set_version(body)
        return {"success": True, "message": f"updated {len(received)} tensors"}

    def _destroy_group(self, body: dict[str, Any]) -> dict[str, Any]:
        from toolgym.inference.weight_sync import leave_weight_group

        group = self.groups.pop(body.get("group_name", ""), None)
        if group is not None:
            leave_weight_group(group)
        return {"success": True, "message": "left"}

    def __enter__(self) -> ProtocolServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving and release the port."""
        self.httpd.shutdown()
        self.httpd.server_close()


def main(argv: list[str] | None = None) -> None:
    """Serve a model directory until killed (see the module docstring)."""
    import argparse

    from toolgym.inference.hf_policy import HFPolicy

    parser = argparse.ArgumentParser(description="a test server speaking sglang's /generate protocol")
    parser.add_argument("model", help="a from_pretrained directory")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="hold every generation this long")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # several of these share a small machine in tests
    server = ProtocolServer(HFPolicy(args.model, device="cpu"), port=args.port, delay_s=args.delay_ms / 1000)
    print(f"listening on {server.url}", flush=True)
    server.httpd.serve_forever()


if __name__ == "__main__":
    main()
