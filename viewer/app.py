"""`toolgym view RUN [RUN2]`: a local web app over one or two run directories.

Standard library HTTP server and Jinja2 templates (no build step, works offline). Pages:

- `/`              the run: its config, the evaluation table per label and suite with CIs, the
                   curves (the run's own PNG plots), the last metrics;
- `/rollouts`      one step's rollouts (or an evaluation's trajectories), filterable by suite,
                   family, outcome, minimum reward, side-effect kind and truncation, sortable by
                   reward or length; `audit=1` shows the step's audit sample;
- `/episode`       one trajectory: every token span coloured by provenance (template, policy,
                   observation) with the loss mask, token id and sampled log-prob on hover; the
                   conversation; the verdict with each hidden test; side effects;
- `/compare`       two evaluations on the same tasks: the tasks that flipped either way, with
                   links to both episodes (SFT vs final of one run, or final vs final of two runs).

A bad request (an unknown file, a half-written run) is a readable page with the reason.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

from toolgym.viewer.data import Run, RunError, audit_sample, flips

PAGE_ROWS = 500


def _templates():
    import jinja2

    root = resources.files("toolgym.viewer").joinpath("templates")
    # optional fields of a trajectory (a message's name, a verdict) render as nothing when absent
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(root)), autoescape=True)
    env.filters["pct"] = lambda v: "n/a" if v is None else f"{100 * v:.1f}%"
    env.globals["urlencode"] = urlencode
    return env


class Viewer:
    """The app: one or two runs, a template environment, and the tokenizer (loaded on first use)
    that splits a trajectory into its tokens' texts."""

    def __init__(self, runs: list[Run]) -> None:
        self.runs = runs
        self.templates = _templates()
        self._tokenizers: dict[str, Any] = {}
        self._lock = threading.Lock()

    # ---- pages ---------------------------------------------------------------------------------

    def page(self, path: str, query: dict[str, str]) -> tuple[int, str]:
        """(status, HTML) of one page."""
        run = self._run(query)
        route = {"/": self.overview, "/rollouts": self.rollouts, "/episode": self.episode, "/compare": self.compare}
        if path not in route:
            return 404, self._render("error.html", run=run, message=f"no page {path}")
        try:
            return 200, route[path](run, query)
        except RunError as err:
            return 400, self._render("error.html", run=run, message=str(err))

    def overview(self, run: Run, query: dict[str, str]) -> str:
        evals = run.evaluations()
        suites = sorted({s for by_suite in evals.values() for s in by_suite})
        metrics = run.metrics()
        train = [m for m in metrics if m.get("kind") == "train"]
        return self._render(
            "overview.html",
            run=run,
            config=run.config_text(),
            evals=evals,
            suites=suites,
            plots=run.plots(),
            last=train[-1] if train else None,
            steps=run.steps(),
            eval_sources=run.eval_sources(),
            rollouts=len(run.steps()),
        )

    def rollouts(self, run: Run, query: dict[str, str]) -> str:
        steps, evals = run.steps(), run.eval_sources()
        sources = steps + evals
        if not sources:
            raise RunError(f"{run.path} has no rollouts or evaluation trajectories yet")
        source = query.get("source") or (steps or evals)[-1]  # the latest training step by default
        rows = run.rows(source)
        audit = query.get("audit") == "1"
        labelled = audit_sample(rows) if audit else [("", r) for r in rows]
        keep = []
        for label, r in labelled:
            if query.get("suite") and r.suite != query["suite"]:
                continue
            if query.get("family") and r.family != query["family"]:
                continue
            if query.get("outcome") and r.outcome != query["outcome"]:
                continue
            if query.get("min_reward") and r.reward < float(query["min_reward"]):
                continue
            if query.get("effect") and query["effect"] not in r.effects:
                continue
            if query.get("truncated") == "1" and not r.limit_hit:
                continue
            keep.append((label, r))
        sort = query.get("sort", "")
        if sort == "reward":
            keep.sort(key=lambda x: -x[1].reward)
        elif sort == "length":
            keep.sort(key=lambda x: -x[1].tokens)
        choices = {
            "suite": sorted({r.suite for r in rows}),
            "family": sorted({r.family for r in rows}),
            "outcome": sorted({r.outcome for r in rows}),
            "effect": sorted({e for r in rows for e in r.effects}),
        }
        return self._render(
            "rollouts.html",
            run=run,
            sources=sources,
            source=source,
            rows=keep[:PAGE_ROWS],
            total=len(keep),
            shown=min(len(keep), PAGE_ROWS),
            query=query,
            choices=choices,
            audit=audit,
        )

    def episode(self, run: Run, query: dict[str, str]) -> str:
        source, index = query.get("source", ""), int(query.get("i", "0"))
        traj = run.trajectory(source, index)
        spans = self._spans(run, traj)
        mask = [1 if s.get("kind") == "policy" else 0 for s in traj.get("segments", []) for _ in s.get("token_ids", [])]
        verdict = traj.get("verdict") or {}
        return self._render(
            "episode.html",
            run=run,
            traj=traj,
            source=source,
            index=index,
            spans=spans,
            trained=sum(mask),
            total=len(mask),
            verdict=verdict,
            messages=traj.get("messages", []),
            effects=traj.get("side_effects", []),
        )

    def compare(self, run: Run, query: dict[str, str]) -> str:
        candidates = [(r.name, src) for r in self.runs for src in r.eval_sources()]
        if len(candidates) < 2:
            raise RunError("comparing needs two evaluations (two labels of one run, or two runs)")
        default_a, default_b = candidates[0], candidates[-1]
        a_run, a_src = self._pick(query.get("a"), default_a)
        b_run, b_src = self._pick(query.get("b"), default_b)
        only_a, only_b, common = flips(a_run.rows(a_src), b_run.rows(b_src))
        return self._render(
            "compare.html",
            run=run,
            candidates=candidates,
            a=(a_run.name, a_src),
            b=(b_run.name, b_src),
            only_a=only_a,
            only_b=only_b,
            common=common,
            a_run=self.runs.index(a_run),
            b_run=self.runs.index(b_run),
        )

    # ---- helpers -------------------------------------------------------------------------------

    def _run(self, query: dict[str, str]) -> Run:
        index = int(query.get("run", "0") or 0)
        if not 0 <= index < len(self.runs):
            raise RunError(f"no run #{index}")
        return self.runs[index]

    def _pick(self, value: str | None, default: tuple[str, str]) -> tuple[Run, str]:
        name, _, source = (value or "").partition(":")
        if not value:
            name, source = default
        for r in self.runs:
            if r.name == name:
                return r, source
        raise RunError(f"no run named {name!r}")

    def _render(self, template: str, **context: Any) -> str:
        context.setdefault("runs", self.runs)
        return self.templates.get_template(template).render(**context)

    def _tokenizer(self, run: Run) -> Any | None:
        """The run's tokenizer (its exported final model's), or None: spans are then per segment."""
        key = str(run.path)
        with self._lock:
            if key not in self._tokenizers:
                tok = None
                model = run.path / "final-model"
                if (model / "tokenizer_config.json").exists():
                    try:
                        from transformers import AutoTokenizer

                        tok = AutoTokenizer.from_pretrained(str(model))
                    except Exception:  # a broken export: show segments whole rather than fail the page
                        tok = None
                self._tokenizers[key] = tok
            return self._tokenizers[key]

    def _spans(self, run: Run, traj: dict[str, Any]) -> list[dict[str, Any]]:
        """Token spans: kind, mask, text, token id and log-prob (one per token when the tokenizer
        is at hand, else one per segment)."""
        tok = self._tokenizer(run)
        out = []
        for seg in traj.get("segments", []):
            kind, ids, logprobs = seg.get("kind", ""), seg.get("token_ids", []), seg.get("logprobs") or []
            mask = 1 if kind == "policy" else 0
            if tok is None:
                out.append(
                    {
                        "kind": kind,
                        "mask": mask,
                        "text": seg.get("text", ""),
                        "ids": len(ids),
                        "title": f"{kind}: {len(ids)} tokens",
                        "tokens": len(ids),
                    }
                )
                continue
            for j, token in enumerate(ids):
                logprob = f", logp {logprobs[j]:.3f}" if j < len(logprobs) else ""
                out.append(
                    {
                        "kind": kind,
                        "mask": mask,
                        "text": tok.decode([token], skip_special_tokens=False),
                        "title": f"{kind} · id {token}{logprob}",
                        "tokens": 1,
                    }
                )
        return out


def _handler(viewer: Viewer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            url = urlparse(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            if url.path.startswith("/file/"):  # a run's own plot
                try:
                    run = viewer._run(query)
                    path = (run.path / url.path[len("/file/") :]).resolve()
                    if run.path.resolve() not in path.parents or path.suffix != ".png" or not path.is_file():
                        raise RunError("not a plot of this run")
                    return self._send(200, path.read_bytes(), "image/png")
                except RunError as err:
                    return self._send(404, str(err).encode(), "text/plain")
            try:
                code, html = viewer.page(url.path, query)
            except Exception as err:  # never a stack trace in the browser: the reason, readable
                code, html = (500, viewer._render("error.html", run=viewer.runs[0], message=f"{type(err).__name__}: {err}"))
            self._send(code, html.encode(), "text/html; charset=utf-8")

    return Handler


def serve(paths: list[str | Path], host: str = "127.0.0.1", port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """Start the viewer on a background thread; returns (server, its URL). `RunError` if a path
    is not a run."""
    viewer = Viewer([Run(p) for p in paths])
    server = ThreadingHTTPServer((host, port), _handler(viewer))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{server.server_address[0]}:{server.server_address[1]}"


__all__ = ["Viewer", "serve"]
