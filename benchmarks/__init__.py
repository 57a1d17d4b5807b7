"""The benchmark runner (`python -m benchmarks`). lpu is imported first: it turns numpy's huge-page
advice off (NUMPY_MADVISE_HUGEPAGE, lpu/__init__.py), which numpy reads once, when it is first
imported; imported after numpy, the runner's compiles had paid the kernel's compaction (bert_base
12 layers 9.7-10.5 s, 3.8 s of it system time, against 5.4-6.1 s in `lpu compile`)."""
import lpu  # noqa: F401  (before numpy: see above)
