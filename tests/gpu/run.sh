#!/usr/bin/env bash
# The GPU suite in one short run: every test of tests/gpu (side by side with pytest-xdist when it is installed),
# then one JSON of results (each test's outcome, time, skip reason or failure, its recorded timings; the machine).
#
#   bash tests/gpu/run.sh [OUT.json]          default OUT: gpu_results.json in the repository root
#
# Each test skips with its reason where it cannot run: without CUDA, without vllm (the vLLM tests), with fewer than
# two GPUs (tests/gpu/test_gpu_two.py). The whole run stops after PLUGRL_GPU_LIMIT_S seconds (470: under 8 minutes
# with the summary); PLUGRL_GPU_WORKERS sets the parallel runs (4: the vLLM runs take 0.15 of a GPU each).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-gpu_results.json}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
parallel=()
if python -c "import xdist" 2>/dev/null; then
    parallel=(-n "${PLUGRL_GPU_WORKERS:-4}")
fi
start=$(date +%s)
timeout -k 20 "${PLUGRL_GPU_LIMIT_S:-470}" python -m pytest tests/gpu -v -rs -p no:cacheprovider "${parallel[@]}" \
    --junitxml="$work/junit.xml" 2>&1 | tee "$work/pytest.log"
code=${PIPESTATUS[0]}
python tests/gpu/results.py --junit "$work/junit.xml" --log "$work/pytest.log" --exit-code "$code" \
    --seconds "$(( $(date +%s) - start ))" --out "$out"
exit "$code"
