#!/usr/bin/env bash
# Run every benchmark and keep their output in benchmarks/results/latest.txt.
#
#   benchmarks/run_all.sh            # full runs (several minutes on 2 cores)
#   benchmarks/run_all.sh --quick    # CI-sized runs (each well under a minute)
#
# PYTHON overrides the interpreter (default: .venv/bin/python, else python3). A full run
# regenerates the packing and replay charts at docs/packing.png and docs/replay.png (a quick one
# writes them under results/).
#
# Every benchmark runs even when one before it fails. The exit status is non-zero when any of
# them crashed (an exception, a non-zero exit, or no end within LIMIT seconds): a benchmark that
# cannot run any more must fail CI, not stop the others silently. A missed goal is a verdict in
# the output, never a failure: figures move with the machine's load.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
quick=()
chart=docs/packing.png
replay_chart=docs/replay.png
limit=1800
if [[ "${1:-}" == "--quick" ]]; then
    quick=(--quick)
    chart=benchmarks/results/packing-quick.png
    replay_chart=benchmarks/results/replay-quick.png
    limit=300
elif [[ $# -gt 0 ]]; then
    echo "usage: benchmarks/run_all.sh [--quick]" >&2
    exit 2
fi
limit="${LIMIT:-$limit}"

mkdir -p benchmarks/results
out=benchmarks/results/latest.txt
{
    echo "jupyter-gpushare benchmarks, $(date -u +%Y-%m-%dT%H:%M:%SZ)${quick:+ (quick)}"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' + uncommitted changes')"
    echo "nproc: $(nproc)"
    echo "cpu: $(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)"
    echo "python: $("$PYTHON" --version 2>&1)"
    echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
} | tee "$out"

failed=()
timings=()
run() {
    local name started status seconds
    name="$(basename "$1")"
    echo | tee -a "$out"
    echo "===== $* =====" | tee -a "$out"
    started=$SECONDS
    # Kernel and tool chatter goes to stderr (shown, not kept); the tables go to the file.
    timeout --kill-after=30 "$limit" "$PYTHON" "$@" | tee -a "$out"
    status=${PIPESTATUS[0]}
    seconds=$((SECONDS - started))
    timings+=("$name ${seconds}s")
    if [[ $status -ne 0 ]]; then
        if [[ $status -eq 124 || $status -eq 137 ]]; then
            echo "FAILED: $name did not end within $limit s" | tee -a "$out"
        else
            echo "FAILED: $name exited with status $status" | tee -a "$out"
        fi
        failed+=("$name")
    fi
}

run benchmarks/kernel_start.py "${quick[@]}"
run benchmarks/ledger_throughput.py "${quick[@]}"
run benchmarks/packing.py "${quick[@]}" --plot "$chart"
run benchmarks/api_latency.py "${quick[@]}"
run benchmarks/sampler.py "${quick[@]}"
run benchmarks/broker_start.py "${quick[@]}"
run benchmarks/broker_streams.py "${quick[@]}"
run benchmarks/broker_cluster.py "${quick[@]}"
run benchmarks/broker_scale.py "${quick[@]}" --against-plain
run benchmarks/replay.py "${quick[@]}" --plot "$replay_chart"
# Kueue's rounds play in real time (holds of seconds): longer than the others' limit even quick.
limit=$((limit * 2)) run benchmarks/kueue_wait.py "${quick[@]}"

{
    echo
    echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
    echo "took: ${timings[*]}"
    if [[ ${#failed[@]} -gt 0 ]]; then
        echo "FAILED: ${failed[*]} (see their output above)"
    else
        echo "all benchmarks ran"
    fi
} | tee -a "$out"
echo "written to $out" >&2
[[ ${#failed[@]} -eq 0 ]]
