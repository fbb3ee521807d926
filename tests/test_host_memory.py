"""The process gives freed memory back to the OS (`inference/host_memory.py`)."""

from __future__ import annotations

from toolgym.inference.host_memory import peak_resident_gb, release_memory, resident_gb


def test_release_memory_returns_freed_heap_memory_to_the_os():
    # 100 KB blocks sit on malloc's heap (below its mmap threshold). Freeing every other one leaves
    # ~200 MB free in holes between live blocks, which glibc keeps for reuse and cannot give back
    # from the heap's top: the case of a process whose batches differ in size.
    blocks = [bytearray(100_000) for _ in range(4000)]
    held = resident_gb()
    del blocks[::2]
    kept = resident_gb()
    release_memory()
    released = resident_gb()
    assert held - kept < 0.05, "freeing gave the memory back at once: the test no longer exercises the heap"
    assert kept - released > 0.12, (held, kept, released)
    assert peak_resident_gb() > 0.99 * held  # the peak remembers it (VmHWM and VmRSS agree within 1%)
    assert len(blocks) == 2000
