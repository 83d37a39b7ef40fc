#!/usr/bin/env bash
# Runs `ttrace compare` on a Slurm cluster: a job array of N partitions
# (`ttrace compare --partition I/N`, one array task each) and a merge job that runs once
# every partition succeeded (`ttrace report merge`).
#
# Usage (on a login node; the stores must be on a file system every node sees):
#
#   scripts/slurm/compare-array.sh -n N -o OUTDIR [-s "SBATCH OPTIONS"] REF RUN [COMPARE OPTIONS...]
#
#   -n N        partitions (array tasks), default 8
#   -o OUTDIR   where the partial reports, logs and the merged report go (created)
#   -s OPTS     extra sbatch options for both jobs, e.g. "-p cpu -A myproject -t 2:00:00"
#   COMPARE OPTIONS are passed to every partition, e.g. --perturbed REF-PERTURBED --memory 4G
#
# Result: OUTDIR/report.json, report.html and report.txt (the merge job's stdout). The merge
# job exits like `ttrace compare`: 0 match, 1 divergence, 2 error, 5 a match of a capture that
# lost data. A partition exits 3 (its
# share matched) or 4 (it diverged); this script maps both to 0 so that the merge's
# `afterok` dependency holds, and keeps 2 (an error), which cancels the merge.
#
# `ttrace` is taken from PATH, or from $TTRACE. Each array task uses the CPUs Slurm gives it
# (compare runs a thread per core: ask for them with -s "--cpus-per-task=16").
set -euo pipefail

ttrace=${TTRACE:-ttrace}

# Inside the array: compare this task's partition.
if [[ ${1:-} == --task ]]; then
    shift
    out=$1 ref=$2 run=$3
    shift 3
    i=${SLURM_ARRAY_TASK_ID:?not in a Slurm array task}
    n=${SLURM_ARRAY_TASK_COUNT:?not in a Slurm array task}
    rc=0
    "$ttrace" compare "$ref" "$run" --partition "$i/$n" --json "$out/part-$i-of-$n.json" "$@" ||
        rc=$?
    case $rc in
    3 | 4) exit 0 ;;
    *) exit "$rc" ;;
    esac
fi

# The merge job: every partition's report.
if [[ ${1:-} == --merge ]]; then
    out=$2 n=$3
    parts=()
    for ((i = 1; i <= n; i++)); do
        parts+=("$out/part-$i-of-$n.json")
    done
    exec "$ttrace" report merge "${parts[@]}" --json "$out/report.json" --html "$out/report.html"
fi

usage() {
    sed -n '8,13s/^#//p' "$0" >&2
    exit 2
}

n=8 out='' sbatch_opts=''
while getopts "n:o:s:h" opt; do
    case $opt in
    n) n=$OPTARG ;;
    o) out=$OPTARG ;;
    s) sbatch_opts=$OPTARG ;;
    *) usage ;;
    esac
done
shift $((OPTIND - 1))
[[ $# -ge 2 && -n $out && $n =~ ^[1-9][0-9]*$ ]] || usage
ref=$(realpath "$1") run=$(realpath "$2")
shift 2
mkdir -p "$out"
out=$(realpath "$out")
script=$(realpath "$0")
read -r -a extra <<<"$sbatch_opts"

array=$(sbatch --parsable "${extra[@]}" --job-name=ttrace-compare --array="1-$n" \
    --output="$out/part-%a-of-$n.log" \
    "$script" --task "$out" "$ref" "$run" "$@")
array=${array%%;*}
merge=$(sbatch --parsable "${extra[@]}" --job-name=ttrace-merge \
    --dependency="afterok:$array" --kill-on-invalid-dep=yes \
    --output="$out/report.txt" \
    "$script" --merge "$out" "$n")
echo "partitions: job array $array (1-$n); merge: job ${merge%%;*}; reports in $out"
