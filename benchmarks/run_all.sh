#!/usr/bin/env bash
# Run the benchmarks and keep their output in benchmarks/results/latest.txt.
#
#   benchmarks/run_all.sh            # full runs (a few minutes on 2 cores)
#   benchmarks/run_all.sh --quick    # CI-sized runs (each < 60 s)
#
# PYTHON overrides the interpreter (default: .venv/bin/python, else python3).
# The packing and replay charts are regenerated at docs/packing.png and docs/replay.png. Exit
# status is non-zero if a benchmark fails to run; a missed goal is reported in the output, not as
# a failure.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
quick=()
if [[ "${1:-}" == "--quick" ]]; then quick=(--quick); fi

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

run() {
    echo | tee -a "$out"
    echo "===== $* =====" | tee -a "$out"
    # Kernel and tool chatter goes to stderr (not kept); the tables go to the file.
    "$PYTHON" "$@" | tee -a "$out"
}

run benchmarks/kernel_start.py "${quick[@]}"
run benchmarks/ledger_throughput.py "${quick[@]}"
run benchmarks/packing.py "${quick[@]}" --plot docs/packing.png
run benchmarks/api_latency.py "${quick[@]}"
run benchmarks/sampler.py "${quick[@]}"
run benchmarks/broker_start.py "${quick[@]}"
run benchmarks/broker_cluster.py "${quick[@]}"
run benchmarks/replay.py "${quick[@]}" --plot docs/replay.png
echo | tee -a "$out"
echo "written to $out" >&2
