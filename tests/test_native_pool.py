"""The native pool's spin-then-park waits (codegen/pool_ir.py): back-to-back sections give
every thread's chunk, complete, with no parking at all, with parking every time, and with a
spin so short that spinning and parking race; sections from two Python threads at once;
fork while the workers spin; a hush that parks spinning workers at once; and a wake that sets
parked workers spinning ahead of a section.  Each case runs in a probe process with a
timeout, so a lost wake-up fails the test instead of hanging."""
import os

from conftest import run_probe

TESTS = os.path.dirname(os.path.abspath(__file__))

SETUP = f"""
import os, sys, threading, time
sys.path.insert(0, {TESTS!r})
from lazycandle.runtime import native_pool
from pool_cases import run_sections, stamp_kernel
cm, addr = stamp_kernel()
native_pool.ensure(3)
while native_pool.ready() < 2:
    time.sleep(0.01)

def cpu_seconds():
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
"""

BACK_TO_BACK = SETUP + """
for spin_us in (native_pool.SPIN_US, 0.0, 0.3):
    native_pool.set_spin_us(spin_us)
    ids = run_sections(addr, 3, 1500)
    assert 0 not in ids, (spin_us, ids)     # every home range's first chunk ran (on some thread)
    if spin_us == native_pool.SPIN_US:      # spinning workers are there to run their own ranges,
        deadline = time.time() + 30         # when the OS gives them a core: 3 threads share 2 here
        while len(ids) < 3 and time.time() < deadline:
            ids |= run_sections(addr, 3, 1500)
        assert len(ids) == 3, (spin_us, ids)
    assert run_sections(addr, 2, 300) and run_sections(addr, 1, 10)
print("ok")
"""


def test_back_to_back_sections_get_every_chunk_from_every_thread_spinning_or_parking():
    assert "ok" in run_probe(BACK_TO_BACK, timeout=120)


TWO_CALLERS = SETUP + """
errors = []

def work(first):
    try:
        run_sections(addr, 3, 800, first=first)
    except AssertionError as e:
        errors.append(str(e))

for spin_us in (native_pool.SPIN_US, 0.0):
    native_pool.set_spin_us(spin_us)
    threads = [threading.Thread(target=work, args=(k * 10_000,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
assert not errors, errors
print("ok")
"""


def test_sections_from_two_python_threads_queue_and_stay_correct():
    assert "ok" in run_probe(TWO_CALLERS, timeout=120)


FORK_WHILE_SPINNING = SETUP + """
native_pool.set_spin_us(2e6)          # the workers still spin (off the mutex) when the process forks
run_sections(addr, 3, 200)
pid = os.fork()
native_pool.set_spin_us(native_pool.SPIN_US)      # both sides: back to the usual budget
if pid == 0:
    ok = len(run_sections(addr, 3, 200)) >= 1
    deadline = time.time() + 60
    while native_pool.ready() < 2 and time.time() < deadline:
        time.sleep(0.01)
    ok = ok and native_pool.ready() == 2 and len(run_sections(addr, 3, 200)) >= 1
    os._exit(0 if ok else 3)
native_pool.hush()
ids = run_sections(addr, 3, 200)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert ids, ids
print("ok")
"""


def test_fork_while_workers_spin_gives_a_working_child_pool():
    assert "ok" in run_probe(FORK_WHILE_SPINNING, timeout=120)


HUSH = SETUP + """
native_pool.set_spin_us(5e6)          # five seconds of spin: without the hush both workers poll
run_sections(addr, 3, 5)
native_pool.hush()
time.sleep(0.05)
before = cpu_seconds()
time.sleep(1.0)
print("hushed cpu seconds", cpu_seconds() - before)
assert run_sections(addr, 3, 50)             # the next sections run in full (the workers woken again)
print("ok")
"""


def test_hush_parks_spinning_workers_at_once():
    out = run_probe(HUSH, timeout=120)
    used = float(out.split("hushed cpu seconds")[1].split()[0])
    assert used < 0.1, f"hushed workers used {used:.3f} s of CPU in 1 s"      # spinning: ~2 s
    assert "ok" in out


LEFT_OUT = SETUP + """
def running_threads():
    states = []
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != os.getpid():                 # the main thread, reading this, runs
            with open(f"/proc/self/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
    return states.count("R")

native_pool.set_spin_us(5e6)          # the one worker in the sections spins on for seconds
ids = run_sections(addr, 2, 50)
deadline = time.time() + 30           # on a loaded machine the worker may get no core before
while len(ids) < 2 and time.time() < deadline:      # the caller has run every chunk
    ids |= run_sections(addr, 2, 50)
assert len(ids) == 2, ids
time.sleep(0.05)
print("running", [running_threads() for _ in range(5)])
"""


def test_workers_a_section_leaves_out_park_instead_of_spinning():
    out = run_probe(LEFT_OUT, timeout=120)
    assert "running [1, 1, 1, 1, 1]" in out, out


WAKE = SETUP + """
import lazycandle as lc
lc.set_num_threads(3)                 # wake() acts only above one thread
native_pool.set_spin_us(0.0)          # workers park as soon as a section ends
assert run_sections(addr, 3, 20)
time.sleep(0.05)
before = cpu_seconds()
time.sleep(0.5)
parked = cpu_seconds() - before
native_pool.set_spin_us(5e6)          # ... and after a wake spin for seconds
native_pool.wake()
time.sleep(0.05)
before = cpu_seconds()
time.sleep(0.5)
woken = cpu_seconds() - before
native_pool.hush()
native_pool.set_spin_us(native_pool.SPIN_US)
for _ in range(200):                  # wakes before, between and after sections lose no chunk
    native_pool.wake()
    assert run_sections(addr, 3, 2)
    native_pool.wake()
print("parked", parked, "woken", woken)
print("ok")
"""


def test_wake_sets_parked_workers_spinning_and_sections_stay_complete():
    out = run_probe(WAKE, timeout=120)
    parked, woken = (float(out.split(k)[1].split()[0]) for k in ("parked", "woken"))
    assert parked < 0.1, f"parked workers used {parked:.3f} s of CPU in 0.5 s"
    # spinning: ~1 s on a quiet machine; a loaded one gives the two spinners less (0.25 s at load 5)
    assert woken > 0.1, f"woken workers used only {woken:.3f} s of CPU in 0.5 s (spinning: ~1 s)"
    assert "ok" in out
