#!/usr/bin/env bash
# Round 10, call 1: the first look at cuda-blas and cuda-rand on the GPU: their suites, the MLP
# example, bench_blas beside torch/CuPy, bench_rand beside torch/CuPy.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
cp tests/bundle/*.py $B/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
here=$B
eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
echo "cuBLAS: ${CUDA_CUBLAS_LIBRARY:-unset}  cuRAND: ${CUDA_CURAND_LIBRARY:-unset}"
echo "=== gpu_blas gpu_rand"
names="gpu_blas gpu_rand" timeout 240 bash $B/run.sh tests > $OUT/suite.txt 2>&1; grep -vE "^    \| (test .* ok|running|$)" $OUT/suite.txt | head -80
echo "=== mlp example  [$(( $(date +%s) - t0 )) s]"
timeout 60 $B/examples/mlp 2>&1 | tail -12
echo "=== blas peers  [$(( $(date +%s) - t0 )) s]"
timeout 150 python3 $B/blas_peers.py $OUT/blas_peers.txt > $OUT/blas_peers_out.txt 2>&1; tail -3 $OUT/blas_peers_out.txt
echo "=== bench_blas  [$(( $(date +%s) - t0 )) s]"
timeout 150 $B/bench/bench_blas $OUT/blas_peers.txt 2>&1 | tee $OUT/bench_blas.txt
echo "=== bench_rand + rand_peers  [$(( $(date +%s) - t0 )) s]"
timeout 120 python3 $B/rand_peers.py --ours $B/bench/bench_rand 2>&1 | tail -14
echo "[$(( $(date +%s) - t0 )) s]"
