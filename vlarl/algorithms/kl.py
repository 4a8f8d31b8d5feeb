"""KL(pi || pi_ref) estimated from samples a ~ pi (Schulman, "Approximating KL divergence", 2020).

With log r = log pi_ref(a) - log pi(a):
    k1 = -log r              unbiased, high variance, can be negative
    k2 = (log r)^2 / 2       biased, low variance, >= 0
    k3 = (r - 1) - log r     unbiased, low variance, >= 0
All elementwise, any shape; gradients flow through ``logprob`` (the current policy).
"""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_estimate(logprob: torch.Tensor, ref_logprob: torch.Tensor, estimator: str) -> torch.Tensor:
    log_r = ref_logprob - logprob
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r.pow(2)
    if estimator == "k3":
        log_r = log_r.clamp(-20.0, 20.0)  # exp overflow guard; far outside any sane update
        return log_r.exp() - 1.0 - log_r
    raise ValueError(f"algorithm.kl_estimator='{estimator}' is unknown; choose one of {KL_ESTIMATORS}")
