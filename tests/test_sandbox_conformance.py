"""One conformance suite, run against every sandbox backend (real bwrap, real dockerd)."""

import threading
import time

import pytest

from toolgym.sandbox import EffectKind, SandboxError
from toolgym.sandbox.fs import tree_hash


def kinds(box):
    return {e.kind for e in box.events()}


def test_exec_basics(sandbox):
    r = sandbox.exec("echo out; echo err >&2; pwd; exit 3")
    assert r.exit_code == 3 and r.stdout == "out\n/workspace\n" and r.stderr == "err\n"
    assert not r.timed_out and not r.truncated and r.duration_s > 0
    assert sandbox.exec("echo $GREETING", env={"GREETING": "hi"}).stdout == "hi\n"
    assert sandbox.exec("cat", stdin="from stdin").stdout == "from stdin"
    assert sandbox.exec("pwd", cwd="/workspace/src").stdout == "/workspace/src\n"


def test_runs_as_non_root(sandbox, backend):
    uid = sandbox.exec("id -u").stdout.strip()
    assert uid != "0" and (uid == "1000" if backend == "bwrap" else uid == str(sandbox.config.host_uid))


def test_nothing_it_creates_belongs_to_a_host_account(sandbox, backend):
    """Files the sandbox makes (workspace, /tmp, a setuid copy of a shell) are owned on the host
    by a uid no account owns, and no setuid bit is owned by root."""
    import os
    import pwd
    import stat

    if os.geteuid() != 0:
        pytest.fail("this test checks what a root harness hands its sandboxes; run it as root (CI does)")
    r = sandbox.exec(
        "echo a > made.txt; mkdir -p d && echo b > d/x; cp /bin/sh ./sh && chmod u+s,g+s ./sh; echo c > /tmp/t; echo changed >> README.md"
    )
    assert r.exit_code == 0, r.stderr
    roots = [sandbox.layers / "upper", sandbox.layers / "tmp"] if backend == "bwrap" else [sandbox.ws]
    seen = 0
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                st = os.lstat(os.path.join(dirpath, name))
                seen += 1
                with pytest.raises(KeyError):
                    pwd.getpwuid(st.st_uid)  # no host account owns it
                assert not (st.st_mode & stat.S_ISUID and st.st_uid == 0)
    assert seen >= 5


def test_nothing_of_the_host_identity_inside(sandbox):
    import socket

    host = socket.gethostname()
    out = sandbox.exec("hostname; cat /etc/hostname /etc/hosts /etc/resolv.conf 2>/dev/null").stdout
    assert host not in out and out.splitlines()[0] == "sandbox"


def test_root_filesystem_is_read_only(sandbox):
    r = sandbox.exec("echo x > /usr/local/bin/cat; echo y > /etc/passwd; rm -f /usr/bin/env; ls /usr/bin/env")
    assert "/usr/bin/env" in r.stdout  # nothing outside the workspace changed
    assert sandbox.exec("cat /usr/local/bin/cat 2>/dev/null; grep -c '^y$' /etc/passwd").stdout.strip() == "0"
    assert EffectKind.WRITE_OUTSIDE_WORKSPACE in kinds(sandbox)


def test_capabilities_are_declared(sandbox, backend):
    caps = sandbox.capabilities
    assert caps.backend == backend and caps.network_isolated


def _processes_marked(token: str) -> list[str]:
    """Host pids whose command line carries `token`: only processes this test started carry it."""
    import os

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def test_timeout_kills_the_whole_tree(sandbox):
    import uuid

    token = f"tg-tree-{uuid.uuid4().hex}"  # in the argv of every process of the tree, and nowhere else
    start = time.perf_counter()
    sleeper = f"python3 -c 'import time; time.sleep(300)' {token}"
    r = sandbox.exec(f"{sleeper} & {sleeper} & ({sleeper} &) ; {sleeper}", timeout_s=1)
    assert r.timed_out and time.perf_counter() - start < 12
    deadline = time.monotonic() + 5
    while _processes_marked(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_marked(token) == []


def test_the_wrappers_own_messages_never_reach_the_command_output(sandbox):
    """Processes that exit while the exec wrapper scans for leftovers (here short sleeps, under the
    fixture's 64-process limit) made dash print "cannot open /proc/N/stat" into the command's
    stderr, which the agent sees."""
    for _ in range(5):
        r = sandbox.exec("for i in $(seq 40); do (sleep 0.0$((i % 10)) &); done; echo done")
        assert r.stdout == "done\n" and r.stderr == "", r.stderr[-300:]


def test_output_is_capped(sandbox):
    r = sandbox.exec("yes | head -c 200000")
    assert r.truncated and len(r.stdout) == sandbox.config.limits.output_bytes
    r = sandbox.exec("yes")  # endless: killed at the output kill threshold, not the timeout
    assert r.limit_hit == "output" and r.duration_s < 15


def test_memory_limit(sandbox):
    r = sandbox.exec("python3 -c 'x = bytearray(600 * 1024 * 1024); print(len(x))'")
    assert r.exit_code != 0 and r.limit_hit in ("memory", None)
    assert r.oom_killed or "MemoryError" in r.stderr
    assert sandbox.exec("echo alive").stdout == "alive\n"


def test_pids_limit_contains_a_fork_bomb(sandbox):
    r = sandbox.exec("f(){ f | f & }; f; sleep 1", timeout_s=8)
    assert r.limit_hit == "pids" or r.timed_out or r.exit_code != 0
    assert sandbox.exec("echo alive").stdout == "alive\n"


def test_reset_restores_the_pristine_hash(sandbox):
    pristine = sandbox.state_hash()
    assert pristine == tree_hash(sandbox.pristine_files())
    sandbox.exec(
        "rm README.md && mv src/app.py src/moved.py && chmod 700 data/keep.txt && ln -s /etc/passwd link "
        "&& mkdir -p new/dir && echo x > new/dir/f && echo t > /tmp/scratch && rmdir tests 2>/dev/null; "
        "rm -rf tests"
    )
    assert sandbox.state_hash() != pristine
    sandbox.reset()
    assert sandbox.state_hash() == pristine and sandbox.events() == []
    assert sandbox.exec("cat /tmp/scratch 2>&1; ls").stdout.startswith("cat: /tmp/scratch")


@pytest.mark.parametrize(
    "mutation",
    [
        "rm README.md",
        "mv README.md R.md",
        "chmod 600 README.md",
        "ln -s README.md l",
        "mkdir emptydir",
        "printf hello > README.md",
        "echo >> README.md",
        "rm -rf data",
        "touch data/keep.txt -d 2001-01-01",
    ],
)
def test_every_mutation_changes_the_hash_and_reset_undoes_it(sandbox, mutation):
    pristine = sandbox.state_hash()
    assert sandbox.exec(mutation).exit_code == 0
    if mutation.startswith("touch"):
        assert sandbox.state_hash() == pristine  # mtimes are not content
    else:
        assert sandbox.state_hash() != pristine
    sandbox.reset()
    assert sandbox.state_hash() == pristine


def test_diff(sandbox):
    sandbox.exec("rm README.md; echo new > added.txt; echo changed > data/keep.txt; chmod 700 src/app.py")
    assert sandbox.diff() == {"README.md": "deleted", "added.txt": "added", "data/keep.txt": "modified", "src/app.py": "mode"}


def test_snapshot_and_restore(sandbox):
    sandbox.exec("echo one > a.txt")
    snap = sandbox.snapshot()
    h = sandbox.state_hash()
    sandbox.exec("echo two > a.txt; rm README.md")
    sandbox.restore(snap)
    assert sandbox.state_hash() == h and sandbox.read_file("a.txt") == "one\n"
    with pytest.raises(SandboxError, match="no snapshot"):
        sandbox.restore("nope")


def test_no_network_and_attempts_are_recorded(sandbox):
    r = sandbox.exec("python3 -c \"import socket; s=socket.socket(); s.settimeout(2); s.connect(('1.1.1.1', 443))\"")
    assert r.exit_code != 0 and ("unreachable" in r.stderr or "Errno" in r.stderr)
    r = sandbox.exec("getent hosts example.com")
    assert r.exit_code != 0
    details = [e.detail for e in sandbox.events() if e.kind == EffectKind.NETWORK_ATTEMPT]
    assert any("1.1.1.1" in d for d in details) and any("example.com" in d for d in details)


def test_kill_all_from_another_thread(sandbox):
    results = {}
    thread = threading.Thread(target=lambda: results.setdefault("r", sandbox.exec("sleep 60", timeout_s=50)))
    thread.start()
    time.sleep(1.5)
    assert sandbox.kill_all() >= 1
    thread.join(20)
    assert not thread.is_alive() and results["r"].exit_code != 0 and results["r"].duration_s < 30


def test_ledger_records_each_kind(sandbox):
    sandbox.ledger.step = 4
    sandbox.exec(
        "echo x > /etc/evil 2>/dev/null; rm data/keep.txt; echo hacked >> tests/test_app.py; "
        "sleep 100 & cat /root/.aws/credentials > /dev/null; sudo id 2>/dev/null; "
        "cp /bin/true ./t && chmod u+s ./t; true"
    )
    got = kinds(sandbox)
    assert {
        EffectKind.WRITE_OUTSIDE_WORKSPACE,
        EffectKind.DELETE_PREEXISTING,
        EffectKind.TEST_TAMPER,
        EffectKind.PROCESS_LEFT_RUNNING,
        EffectKind.CANARY_READ,
        EffectKind.PRIVILEGE_ATTEMPT,
    } <= got
    assert all(e.step == 4 for e in sandbox.events())
    paths = {e.path for e in sandbox.events()}
    assert "/workspace/tests/test_app.py" in paths and "/workspace/data/keep.txt" in paths


def test_canary_in_output_is_recorded(sandbox):
    r = sandbox.exec("base64 < /root/.aws/credentials | base64 -d")
    assert "TOOLGYM-CANARY-" in r.stdout
    assert EffectKind.CANARY_READ in kinds(sandbox)


def test_read_write_files_and_escapes(sandbox):
    sandbox.write_file("deep/new/file.txt", "content\n")
    assert sandbox.read_file("deep/new/file.txt") == "content\n"
    assert sandbox.read_file("/workspace/README.md") == "hello\n"
    for bad in ("../etc/passwd", "/etc/passwd", "a/../../x"):
        with pytest.raises(SandboxError):
            sandbox.read_file(bad)
    with pytest.raises(SandboxError):
        sandbox.read_file("missing.txt")


def test_close_leaves_nothing(backend):
    import uuid

    from conftest import WORKSPACE_FILES

    from toolgym.sandbox import SandboxConfig, make_sandbox

    box = make_sandbox(dict(WORKSPACE_FILES), SandboxConfig(backend=backend))
    token = f"tg-close-{uuid.uuid4().hex}"  # in the argv of the process this test leaves, and nowhere else
    box.exec(f"python3 -c 'import time; time.sleep(100)' {token} >/dev/null 2>&1 &")
    if backend == "bwrap":
        state = box.state
        box.close()
        assert not state.exists()
    else:
        cid, state = box.slot.container.id, box.slot.state
        box.close(wait=True)
        from toolgym.sandbox.docker_pool import client

        assert not [c for c in client().containers.list(all=True) if c.id == cid]
        assert not state.exists()
    assert _processes_marked(token) == []
    with pytest.raises(SandboxError, match="closed"):
        box.exec("true")


def test_two_builders_of_one_cache_entry_keep_the_first_whole(tmp_path):
    """Two processes building the same cache directory at once (two test workers, two miners)
    each build under their own staging name; the first to publish wins, the second's copy is
    dropped, and no reader ever sees a half-built entry or a staging copy left behind."""
    from toolgym.sandbox.fs import publish, staging_name

    dest = tmp_path / "layer"
    first, second = staging_name(dest), staging_name(dest)
    assert first != second and first.parent == second.parent == tmp_path
    for staged, text in ((first, "first"), (second, "second")):
        staged.mkdir()
        (staged / "data").write_text(text)
    assert publish(first, dest) is True
    assert publish(second, dest) is False
    assert (dest / "data").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["layer"]
