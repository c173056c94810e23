#!/bin/bash
# SASS (sm_90) of every fast-kernel translation unit in trees $1 and $2, normalised (addresses and
# encodings dropped), compared per unit; the -Xptxas -v output beside each.
# A change meant to leave the kernels alone shows here as identical SASS.
# usage: bash scripts/sass_compare.sh TREE_BEFORE TREE_AFTER   (cuobjdump, nvdisasm: pip install
# nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm; both on PATH; OUT: where the SASS goes, /tmp/sass)
OUT=${OUT:-/tmp/sass}
mkdir -p $OUT
for f in $(ls $1/csrc/cuda/fast/); do
  for t in $1 $2; do
    tag=$(basename $t)
    (cd $t && nvcc -std=c++17 -O3 -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr -Icsrc -cubin -arch=sm_90 -Xptxas -v -o $OUT/$tag.$f.cubin csrc/cuda/fast/$f > $OUT/$tag.$f.ptxas 2>&1)
    cuobjdump -sass $OUT/$tag.$f.cubin | sed -E 's#/\*[0-9a-f]{4,}\*/##; s#/\* 0x[0-9a-f]+ \*/##' | grep -v '^\s*$' > $OUT/$tag.$f.sass
  done
  a=$OUT/$(basename $1).$f.sass; b=$OUT/$(basename $2).$f.sass
  if cmp -s $a $b; then echo "$f: identical SASS ($(wc -l < $a) lines)"; else echo "$f: DIFFERENT ($(diff $a $b | grep -c '^[<>]') lines differ)"; fi
done
