"""The peer side of `cargo run --release -p examples --example randomized_linalg`.

Reads the matrices the example wrote (raw little-endian f32, shapes in `cases.json`), times
PyTorch's and NumPy/SciPy's factorisations of each on the same machine, in the same run, and
prints one JSON object per line: case, library, operation, median seconds, and the same
accuracy measures the example computes for its own results.
"""

import json
import sys
import time

import numpy as np

try:
    import torch
except ImportError:  # The example reports which peers ran.
    torch = None
try:
    import scipy.linalg
except ImportError:
    scipy = None


def median_seconds(function, repeats):
    function()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def emit(case, library, operation, seconds, **accuracy):
    print(json.dumps({"case": case, "library": library, "operation": operation,
                      "seconds": seconds, **accuracy}), flush=True)


def orthogonality(q):
    q = q.astype(np.float64)
    return float(np.linalg.norm(q.T @ q - np.eye(q.shape[1])))


def main():
    directory, repeats = sys.argv[1], int(sys.argv[2])
    cases = json.load(open(f"{directory}/cases.json"))
    for case in cases:
        a = np.fromfile(f"{directory}/{case['file']}", dtype="<f4").reshape(case["rows"], case["cols"])
        a64 = a.astype(np.float64)
        norm = np.linalg.norm(a64)
        name = case["name"]
        if case["kind"] == "svd":
            k = case["rank"]
            optimal = case["optimal_error"]
            if torch is not None:
                t = torch.from_numpy(a)
                seconds = median_seconds(lambda: torch.linalg.svd(t, full_matrices=False), repeats)
                u, s, vh = torch.linalg.svd(t, full_matrices=False)
                error = np.linalg.norm(a64 - (u[:, :k] * s[:k]).double().numpy() @ vh[:k].double().numpy())
                emit(name, "torch", "torch.linalg.svd", seconds, error_ratio=float(error / optimal))
                q = k + case["oversampling"]
                niter = case["power_iterations"]
                torch.manual_seed(0)
                seconds = median_seconds(lambda: torch.svd_lowrank(t, q=q, niter=niter), repeats)
                u, s, v = torch.svd_lowrank(t, q=q, niter=niter)
                error = np.linalg.norm(a64 - (u[:, :k] * s[:k]).double().numpy() @ v[:, :k].double().numpy().T)
                emit(name, "torch", f"torch.svd_lowrank(q={q}, niter={niter})", seconds,
                     error_ratio=float(error / optimal))
            seconds = median_seconds(lambda: np.linalg.svd(a, full_matrices=False), max(1, repeats // 2))
            emit(name, "numpy", "numpy.linalg.svd", seconds)
        elif case["kind"] == "qr":
            if torch is not None:
                t = torch.from_numpy(a)
                seconds = median_seconds(lambda: torch.linalg.qr(t), repeats)
                q, r = torch.linalg.qr(t)
                q64, r64 = q.double().numpy(), r.double().numpy()
                emit(name, "torch", "torch.linalg.qr", seconds,
                     residual=float(np.linalg.norm(a64 - q64 @ r64) / norm),
                     orthogonality=orthogonality(q64))
            if scipy is not None:
                seconds = median_seconds(
                    lambda: scipy.linalg.qr(a, mode="economic", pivoting=True), repeats)
                q, r, p = scipy.linalg.qr(a, mode="economic", pivoting=True)
                diagonal = np.abs(np.diag(r))
                rank = int(np.sum(diagonal > case["tolerance"] * diagonal[0]))
                emit(name, "scipy", "scipy.linalg.qr(pivoting=True)", seconds,
                     residual=float(np.linalg.norm(a64[:, p] - q.astype(np.float64) @ r.astype(np.float64)) / norm),
                     orthogonality=orthogonality(q), rank=rank)


if __name__ == "__main__":
    main()
