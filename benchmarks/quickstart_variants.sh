#!/usr/bin/env bash
# The quickstart as shipped, with 64 calibration rows, and at ONNX accuracy level 1, on one stage cache (the
# baseline scores and the 30-row GPTQ model are shared); each run's report.json is copied to OUT.
# docs/results/accuracy.md, "The quickstart on an H200 machine", was taken with this on the lent H200 machine.
#   bash benchmarks/quickstart_variants.sh OUT [a] [b] [c]      (a: as shipped, b: 64 rows, c: level 1)
#   bash benchmarks/quickstart_variants.sh OUT "seed1 sens0-seed1"   (calibration seed 1, as shipped and
#     with compress.0.sensitive_layers=0, every linear at 4 bits): docs/results/accuracy.md, "The quickstart with 16
#     groups kept, across calibration seeds"
#   bash benchmarks/quickstart_variants.sh OUT "rows64-seed1"   (64 calibration rows, seed 1: the seeds' spread
#     against the calibration's size)
set -u
out=${1:?usage: quickstart_variants.sh OUT [a] [b] [c]}; shift
mkdir -p "$out"
for v in "${@:-a b c}"; do
  for variant in $v; do
    case $variant in
      a) args=() ;;
      b) args=(-s calibration.samples=64) ;;
      c) args=(-s export.accuracy_level=1) ;;
      seed[0-9]*) args=(-s calibration.seed="${variant#seed}") ;;
      sens[0-9]*-seed[0-9]*) kept=${variant#sens}
        args=(-s compress.0.sensitive_layers="${kept%%-*}" -s calibration.seed="${variant##*-seed}") ;;
      rows[0-9]*-seed[0-9]*) rows=${variant#rows}
        args=(-s calibration.samples="${rows%%-*}" -s calibration.seed="${variant##*-seed}") ;;
      *) echo "unknown variant $variant" >&2; exit 2 ;;
    esac
    start=$(date +%s)
    python3 -m llmopt run recipes/quickstart.toml "${args[@]}" -o "/tmp/quickstart-$variant" --format json \
      > "$out/run-$variant.json" 2> "$out/run-$variant.log"
    echo "$variant exit $? in $(( $(date +%s) - start )) s"
    cp "/tmp/quickstart-$variant/reports/report.json" "$out/report-$variant.json" 2>/dev/null
  done
done
