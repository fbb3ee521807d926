"""The process gives freed memory back to the OS (`harness/host_memory.py`)."""

from __future__ import annotations

from toolgym.harness.host_memory import peak_resident_gb, release_memory, resident_gb


def test_release_memory_returns_freed_heap_memory_to_the_os():
    # 100 KB blocks sit on malloc's heap (below its mmap threshold); one block allocated last pins
    # the top of the heap, so freeing the rest leaves ~300 MB free inside the heap, where glibc
    # keeps it for reuse: the case of a process whose batches differ in size.
    blocks = [bytearray(100_000) for _ in range(3000)]
    pin = bytearray(100_000)
    held = resident_gb()
    del blocks
    kept = resident_gb()
    release_memory()
    released = resident_gb()
    assert held - kept < 0.1, "freeing did not keep the memory: the test no longer exercises the heap"
    assert kept - released > 0.2, (held, kept, released)
    assert peak_resident_gb() > 0.99 * held  # the peak remembers the 300 MB (VmHWM and VmRSS count alike within 1%)
    del pin
