#!/usr/bin/env bash
# Idle local mode: brings the demo mesh up as the README's first command does (`cnimesh-local up`,
# release binaries here), lets it settle, then measures every one of its processes (API server,
# collector, node agent, control plane, mirror if any, the demo's apps and proxies) while nothing
# is sent: CPU % of one core from /proc/<pid>/stat (utime+stime, all threads) and wake-ups per
# second (context switches of every thread, from /proc) over CNIMESH_IDLE_SECONDS; then, after
# that window so that tracing does not disturb it, syscalls per second by kind under
# `strace -c -f` for CNIMESH_IDLE_STRACE_SECONDS, which shows what still polls (openat, getdents64,
# statx, timer wake-ups). Prints one row per process and the total; `cnimesh-local down` at the
# end unless CNIMESH_IDLE_KEEP=1. Opt-in, as root (`apt-get install strace`); not in the test command.
#
#   scripts/bench-local-idle.sh
#   CNIMESH_IDLE_BIN_DIR=/some/release/dir scripts/bench-local-idle.sh   # measure those binaries, no build
#   CNIMESH_IDLE_SETTLE=20 CNIMESH_IDLE_SECONDS=60 CNIMESH_IDLE_STRACE_SECONDS=20 CNIMESH_IDLE_KEEP=1
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "bench-local-idle: run as root (local mode creates network namespaces)" >&2
    exit 1
fi
command -v strace >/dev/null || { echo "bench-local-idle: strace is missing (apt-get install strace)" >&2; exit 1; }
ROOT=/run/cnimesh-local
if [ -e "$ROOT" ]; then
    echo "bench-local-idle: $ROOT exists: local mode is up already (cnimesh-local down first)" >&2
    exit 1
fi
bash scripts/setup.sh
if [ -n "${CNIMESH_IDLE_BIN_DIR:-}" ]; then
    BIN=$CNIMESH_IDLE_BIN_DIR
else
    cargo build --release --quiet -p cnimesh-local -p cnimesh-node -p cnimesh-cni -p cnimesh-proxy \
        -p cnimesh-control -p cnimesh-mirror -p cnimesh-cli
    BIN=${CARGO_TARGET_DIR:-target}/release
fi
if [ "${CNIMESH_IDLE_KEEP:-0}" != 1 ]; then
    trap '"$BIN/cnimesh-local" down >/dev/null || true' EXIT
fi
"$BIN/cnimesh-local" up "$@" >/dev/null
python3 - "$ROOT" "${CNIMESH_IDLE_SETTLE:-20}" "${CNIMESH_IDLE_SECONDS:-60}" "${CNIMESH_IDLE_STRACE_SECONDS:-20}" <<'PY'
import collections, os, signal, subprocess, sys, tempfile, time

root, settle, window, strace_window = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
tick = os.sysconf("SC_CLK_TCK")
marker = f"CNIMESH_LOCAL_ROOT={root}".encode()


def processes():
    """pid -> name: the pid files `up` writes, and any other process started with the root's marker."""
    found = {}
    run = os.path.join(root, "run")
    for entry in sorted(os.listdir(run)):
        try:
            pid = int(open(os.path.join(run, entry)).read().strip())
        except (OSError, ValueError):
            continue
        if os.path.exists(f"/proc/{pid}"):
            found[pid] = entry.removesuffix(".pid")
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in found:
            continue
        try:
            if marker in open(f"/proc/{entry}/environ", "rb").read().split(b"\0"):
                found[int(entry)] = open(f"/proc/{entry}/comm").read().strip()
        except OSError:
            pass
    return found


def cpu_ticks(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def switches(pid):
    """Context switches per thread (voluntary + involuntary): each is the thread going to sleep or being woken."""
    counts = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            total = 0
            for line in open(f"/proc/{pid}/task/{tid}/status"):
                if "ctxt_switches" in line:
                    total += int(line.split()[-1])
            counts[tid] = total
        except OSError:
            pass
    return counts


time.sleep(settle)
procs = processes()
start = time.monotonic()
before = {pid: (cpu_ticks(pid), switches(pid)) for pid in procs}
time.sleep(window)
elapsed = time.monotonic() - start
rows = {}
for pid, name in procs.items():
    try:
        ticks, sw = cpu_ticks(pid), switches(pid)
    except OSError:
        rows[pid] = (name, None, None)
        continue
    cpu = (ticks - before[pid][0]) / tick / elapsed * 100
    wakes = sum(n - before[pid][1].get(tid, 0) for tid, n in sw.items()) / elapsed
    rows[pid] = (name, cpu, wakes)

# Syscalls, after the CPU window: strace slows what it traces.
tmp = tempfile.mkdtemp(prefix="idle-strace-")
tracers = {
    pid: subprocess.Popen(["strace", "-c", "-f", "-q", "-o", f"{tmp}/{pid}", "-p", str(pid)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for pid in procs
}
time.sleep(strace_window)
for tracer in tracers.values():
    tracer.send_signal(signal.SIGINT)
for tracer in tracers.values():
    tracer.wait()
calls = {}
for pid in procs:
    by_name = collections.Counter()
    try:
        for line in open(f"{tmp}/{pid}"):
            parts = line.split()
            # % time, seconds, usecs/call, calls, [errors], syscall
            if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                by_name[parts[-1]] += int(parts[3])
    except OSError:
        pass
    calls[pid] = by_name

print(f"idle local mode: {len(procs)} processes; CPU and wake-ups over {elapsed:.0f} s "
      f"(after {settle:.0f} s settling), syscalls over {strace_window:.0f} s under strace")
print(f"{'process':<22} {'CPU % of a core':>15} {'wake-ups/s':>10} {'syscalls/s':>10}  top syscalls /s")
total_cpu = total_wakes = total_calls = 0.0
for pid, (name, cpu, wakes) in sorted(rows.items(), key=lambda r: r[1][0]):
    c = calls.get(pid, collections.Counter())
    per_s = sum(c.values()) / strace_window
    top = ", ".join(f"{n} {v / strace_window:.1f}" for n, v in c.most_common(4))
    if cpu is None:
        print(f"{name:<22} {'exited':>15}")
        continue
    total_cpu += cpu
    total_wakes += wakes
    total_calls += per_s
    print(f"{name:<22} {cpu:>15.3f} {wakes:>10.1f} {per_s:>10.1f}  {top}")
print(f"{'total':<22} {total_cpu:>15.3f} {total_wakes:>10.1f} {total_calls:>10.1f}")
PY
