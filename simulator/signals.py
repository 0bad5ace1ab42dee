"""Realistic, reproducible signal generators for simulated training nodes.

Every value is a function of a node's own seeded RNG and its step counter, never of
wall-clock time, so the same seed and flags give the same values on every run. The
shapes follow what operators see on a real network: losses that fall with noise and
occasional spikes, a warmup + cosine learning-rate schedule, gradient norms that
shrink as training settles, throughput that depends on the machine, and peers that
come and go.
"""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import dataclass

BENCHMARK_TASKS: tuple[str, ...] = ("arc_challenge", "arc_easy", "hellaswag", "piqa", "winogrande", "mmlu")
# Random-guess score and a plausible ceiling for a small model, per benchmark task.
TASK_RANGE: dict[str, tuple[float, float]] = {
    "arc_challenge": (0.22, 0.38),
    "arc_easy": (0.25, 0.62),
    "hellaswag": (0.25, 0.52),
    "piqa": (0.50, 0.72),
    "winogrande": (0.50, 0.60),
    "mmlu": (0.25, 0.31),
}
GPU_MEMORY_BYTES = 80 * 1024**3  # an 80 GB card
OVERFLOW_RATE = 0.005  # share of mixed-precision steps whose gradient norm overflows to inf


def node_rng(seed: int, role: str, uid: str) -> random.Random:
    """A node's own RNG: string seeds are hashed (SHA-512), so this is stable across processes."""
    return random.Random(f"{seed}/{role}/{uid}")


def binomial(rng: random.Random, trials: int, p: float) -> int:
    """How many of `trials` events of chance `p` happen: exact for a few, a normal approximation for many."""
    if trials <= 64:
        return sum(1 for _ in range(trials) if rng.random() < p)
    mean = trials * p
    return min(trials, max(0, round(rng.gauss(mean, math.sqrt(mean * (1.0 - p))))))


def cosine_lr(step: int, total_steps: int, warmup_steps: int, peak: float, floor: float) -> float:
    """Linear warmup to `peak`, then cosine decay to `floor` at `total_steps` (flat after)."""
    if warmup_steps > 0 and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


@dataclass
class Progress:
    """How far the run is meant to go, so curves span the run whatever its length."""

    total_steps: int
    warmup_steps: int

    @classmethod
    def for_steps(cls, total_steps: int) -> Progress:
        total = max(10, total_steps)
        return cls(total, max(1, total // 20))

    def fraction(self, step: int) -> float:
        return min(1.0, step / self.total_steps)


class MinerSignals:
    """A miner's training curves: loss, learning rate, gradient norms, throughput."""

    def __init__(self, rng: random.Random, progress: Progress, overflow_rate: float = OVERFLOW_RATE) -> None:
        self.rng = rng
        self.progress = progress
        self.overflow_rate = overflow_rate
        self.initial_loss = rng.uniform(10.2, 10.9)  # ~ln(vocabulary) at initialisation
        self.final_loss = rng.uniform(2.6, 3.4)
        self.peak_lr = rng.choice((2e-4, 3e-4, 4e-4))
        self.groups = rng.choice((6, 8, 12))
        self.tokens_per_sec_base = rng.uniform(9_000, 42_000)  # depends on the GPU
        self.batch_tokens = float(rng.choice((131_072, 262_144, 524_288)))
        self._spike = 0.0

    def loss(self, step: int) -> float:
        """Exponential decay towards the final loss, 2% noise, rare spikes that fade."""
        decay = math.exp(-4.0 * self.progress.fraction(step))
        base = self.final_loss + (self.initial_loss - self.final_loss) * decay
        if self.rng.random() < 0.01:
            self._spike = self.rng.uniform(0.2, 1.0)
        self._spike *= 0.8
        return base * (1.0 + self.rng.gauss(0.0, 0.02)) + self._spike

    def learning_rate(self, step: int) -> float:
        p = self.progress
        return cosine_lr(step, p.total_steps, p.warmup_steps, self.peak_lr, self.peak_lr / 10)

    def grad_norms(self, step: int) -> list[float]:
        """One norm per parameter group: large early, settling with training, log-normal spread.

        About one step in 200 (`overflow_rate`) overflows in mixed precision and a
        group's norm is infinite, as the loss scaler sees it; the client drops that
        value (counted as `non_finite`) and writes the statistics of the finite ones.
        """
        scale = 0.4 + 4.0 * math.exp(-6.0 * self.progress.fraction(step))
        norms = [scale * self.rng.lognormvariate(0.0, 0.35) for _ in range(self.groups)]
        if self.overflow_rate and self.rng.random() < self.overflow_rate:
            norms[self.rng.randrange(self.groups)] = math.inf
        return norms

    def tokens_per_sec(self) -> float:
        """Steady throughput with 4% noise and an occasional slow step (I/O, preemption)."""
        slow = 0.55 if self.rng.random() < 0.03 else 1.0
        return max(0.0, self.tokens_per_sec_base * slow * (1.0 + self.rng.gauss(0.0, 0.04)))


class NetworkSignals:
    """A node's view of the peer-to-peer network and of gradient exchange."""

    def __init__(self, rng: random.Random, network_size: int) -> None:
        self.rng = rng
        self.network_size = max(1, network_size)
        self.lag = 0

    def status(self) -> dict[str, float]:
        rng = self.rng
        offline = binomial(rng, self.network_size, 0.06)
        if self.lag:
            self.lag = max(0, self.lag - 1) if rng.random() < 0.6 else self.lag
        elif rng.random() < 0.05:
            self.lag = rng.randint(1, 3)
        return {
            "active_peers": float(max(1, self.network_size - offline)),
            "sync_lag_windows": float(self.lag),
            "is_synced": 0.0 if self.lag else 1.0,
            "gather_success_rate": min(1.0, max(0.0, rng.gauss(0.93, 0.04))),
        }

    def performance(self) -> dict[str, float]:
        rng = self.rng
        gather = rng.lognormvariate(math.log(6.0), 0.3)
        put = rng.lognormvariate(math.log(1.5), 0.25)
        return {
            "compression_ratio": rng.lognormvariate(math.log(42.0), 0.12),
            "gather_time_s": gather,
            "put_time_s": put,
            "step_time_s": gather + put + rng.lognormvariate(math.log(20.0), 0.1),
        }


class ValidatorSignals:
    """Scores, moving averages and weights a validator gives the miners it evaluates."""

    def __init__(self, rng: random.Random, seed: int, miner_uids: list[str], progress: Progress) -> None:
        self.rng = rng
        self.progress = progress
        self.miner_uids = miner_uids
        # A miner's true quality is the same for every validator (seeded by the miner alone).
        self.quality = {uid: random.Random(f"{seed}/quality/{uid}").uniform(0.0, 1.0) for uid in miner_uids}
        self.moving_avg = dict.fromkeys(miner_uids, 0.0)
        self.alpha = 0.2
        self._sharpened_total = 0.0  # sum of moving_avg**2, kept up to date: a weight costs O(1), not O(miners)

    def score(self, eval_uid: str) -> dict[str, float]:
        """One evaluation: quality plus noise; a few miners send garbage and score 0."""
        quality = self.quality[eval_uid]
        score = 0.0 if self.rng.random() < 0.04 else max(0.0, quality + self.rng.gauss(0.0, 0.1))
        previous = self.moving_avg[eval_uid]
        avg = (1 - self.alpha) * previous + self.alpha * score
        self.moving_avg[eval_uid] = avg
        self._sharpened_total += avg**2 - previous**2
        return {"score": score, "moving_avg_score": avg, "weight": self.weight(eval_uid)}

    def weight(self, eval_uid: str) -> float:
        """Weights are the moving averages, sharpened and normalised to sum to 1."""
        total = self._sharpened_total
        return min(1.0, self.moving_avg[eval_uid] ** 2 / total) if total > 1e-12 else 0.0

    def window_summary(self, step: int, evaluated: int) -> dict[str, float]:
        loss_before = 3.0 + 7.5 * math.exp(-4.0 * self.progress.fraction(step)) + self.rng.gauss(0.0, 0.03)
        improvement = max(-0.01, self.rng.gauss(0.012, 0.004))
        return {
            "loss_before": loss_before,
            "loss_after": loss_before * (1.0 - improvement),
            "improvement": improvement,
            "evaluated_uids": float(evaluated),
        }


class AggregatorSignals:
    def __init__(self, rng: random.Random, expected_peers: int) -> None:
        self.rng = rng
        self.expected = max(1, expected_peers)

    def round(self) -> dict[str, float]:
        gathered = binomial(self.rng, self.expected, 0.92)
        return {
            "gradients_gathered": float(gathered),
            "gather_success_rate": gathered / self.expected,
            "aggregation_time_s": 0.05 * gathered * self.rng.lognormvariate(0.0, 0.2),
        }


class EvaluatorSignals:
    """Benchmark scores that climb from chance towards each task's ceiling."""

    def __init__(self, rng: random.Random, progress: Progress) -> None:
        self.rng = rng
        self.progress = progress

    def benchmark(self, task: str, step: int) -> dict[str, float]:
        chance, ceiling = TASK_RANGE[task]
        learned = 1.0 - math.exp(-3.0 * self.progress.fraction(step))
        score = chance + (ceiling - chance) * learned + self.rng.gauss(0.0, 0.008)
        return {
            "score": min(1.0, max(0.0, score)),
            "duration_s": self.rng.lognormvariate(math.log(90.0), 0.2),
        }


class HostSignals:
    """What the client's system sampler reads on a node's host, for history the model writes itself.

    A live simulated node's `system` points are the client's own readings of the
    simulator's machine; the backfill and the tests need a fleet of hosts instead:
    memory that drifts around its level, a disk that fills slowly, CPU that
    follows how busy the role is. A healthy host stays under the alert thresholds.
    """

    def __init__(self, rng: random.Random, busy: float) -> None:
        self.rng = rng
        self.busy = busy
        self.memory_total = float(rng.choice((64, 128, 256, 512)) * 1024**3)
        self.memory_share = rng.uniform(0.3, 0.6)
        self.rss_share = rng.uniform(0.2, 0.5)  # of the memory in use: the training process holds most of it
        self.disk = rng.uniform(20.0, 60.0)

    def sample(self) -> dict[str, float]:
        rng = self.rng
        self.memory_share = min(0.85, max(0.2, self.memory_share + rng.gauss(0.0, 0.01)))
        self.disk = min(85.0, self.disk + rng.uniform(0.0, 0.002))  # checkpoints and logs accumulate
        used = self.memory_total * self.memory_share
        return {
            "cpu_percent": min(100.0, max(0.0, rng.gauss(0.6 * self.busy, 8.0))),
            "memory_used_bytes": used,
            "memory_total_bytes": self.memory_total,
            "memory_percent": 100.0 * self.memory_share,
            "process_rss_bytes": used * self.rss_share,
            "disk_percent": self.disk,
        }


class GpuSignals:
    """Simulated NVML and torch.cuda readings for the node's devices (the host has none)."""

    def __init__(self, rng: random.Random, devices: int, busy: float) -> None:
        self.rng = rng
        self.busy = busy  # typical utilisation: miners near 95%, validators lower
        self.devices = [(str(index), f"GPU-{uuid.UUID(int=rng.getrandbits(128))}") for index in range(max(0, devices))]
        self.allocated = [rng.uniform(0.45, 0.7) * GPU_MEMORY_BYTES for _ in self.devices]
        self.peak = list(self.allocated)
        self.full = False

    def exhaust(self) -> None:
        """An out-of-memory fault: the first device fills up and stays full."""
        self.full = True

    def points(self) -> list[tuple[str, dict[str, str], dict[str, float]]]:
        """`gpu` and `gpu_memory` points, with the tags the client's own GPU sampler uses."""
        rng = self.rng
        out: list[tuple[str, dict[str, str], dict[str, float]]] = []
        for i, (index, gpu_uuid) in enumerate(self.devices):
            drifted = self.allocated[i] * rng.uniform(0.97, 1.03)
            # At most 80% allocated: with the allocator's cache on top, a healthy card stays below 93% in use.
            self.allocated[i] = min(0.8 * GPU_MEMORY_BYTES, max(0.1 * GPU_MEMORY_BYTES, drifted))
            self.peak[i] = max(self.peak[i], self.allocated[i])
            if self.full and i == 0:
                self.allocated[i] = 0.97 * GPU_MEMORY_BYTES
            self.peak[i] = max(self.peak[i], self.allocated[i])
            reserved = min(0.99 * GPU_MEMORY_BYTES, self.allocated[i] * rng.uniform(1.05, 1.15))
            utilization = min(100.0, max(0.0, rng.gauss(self.busy, 4.0)))
            out.append(
                (
                    "gpu",
                    {"gpu_uuid": gpu_uuid, "gpu_index": index, "gpu_name": "NVIDIA H100 80GB HBM3"},
                    {
                        "memory_used_bytes": reserved + 600 * 1024**2,
                        "memory_total_bytes": float(GPU_MEMORY_BYTES),
                        "utilization_percent": utilization,
                        "temperature_c": 38.0 + 0.4 * utilization + rng.gauss(0.0, 1.5),
                        "power_w": 90.0 + 6.0 * utilization + rng.gauss(0.0, 12.0),
                    },
                )
            )
            out.append(
                (
                    "gpu_memory",
                    {"gpu_uuid": gpu_uuid, "gpu_index": index},
                    {
                        "allocated_bytes": self.allocated[i],
                        "reserved_bytes": reserved,
                        "max_allocated_bytes": self.peak[i],
                        "segments": float(int(reserved / (2 * 1024**2)) // 64),
                    },
                )
            )
        return out
