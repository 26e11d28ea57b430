#!/bin/bash
# One 15-minute device session (issue 27's, H100): environment, the bench's step table for all 12 workloads, the
# PyTorch targets, then the suite in the time left. Run from the repository root on the device
# machine; it writes its logs under $OUT (the device tool's output folder).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PROGDESC_CACHE_DIR=/tmp/pdcache
T0=$(date +%s)
el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc;
  python3 -c "import sys,jax,jaxlib,flax,optax,numpy,torch; print(sys.version); print('jax',jax.__version__,'jaxlib',jaxlib.__version__,'flax',flax.__version__,'optax',optax.__version__,'numpy',numpy.__version__,'torch',torch.__version__); print(jax.devices())";
  python3 -c "import progdesc, progdesc.onnx; print('progdesc imports')"; } > $OUT/env.txt 2>&1
cat $OUT/env.txt
el "bench steps (12 workloads)"
timeout 210 python3 -m bench --only steps --bf16 --large --steps 20 --warmup 3 --block 5 --json $OUT/bench_steps.json > $OUT/bench_steps.log 2>&1; echo "rc=$?" >> $OUT/bench_steps.log
tail -60 $OUT/bench_steps.log
el "bench torch targets"
timeout 150 python3 -m bench --only torch,steps --workloads transformer_large,transformer_large_bf16 --steps 20 --json $OUT/bench_torch.json > $OUT/bench_torch.log 2>&1; echo "rc=$?" >> $OUT/bench_torch.log
tail -30 $OUT/bench_torch.log
el "suite"
REM=$(( 545 - ($(date +%s) - T0) ))
timeout $REM python3 -m pytest -n 14 --dist loadfile -m "not slow" -p no:cacheprovider -q -rf --continue-on-collection-errors --junitxml=$OUT/suite.xml > $OUT/suite.log 2>&1; echo "rc=$?" >> $OUT/suite.log
tail -80 $OUT/suite.log
el done
