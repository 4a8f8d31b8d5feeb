"""RL heads: the likelihood part of a policy, given its network's outputs (sample, log-prob, entropy).

* ``gaussian``: a diagonal Gaussian over a chunk, optionally tanh-squashed (``mlp``, ``cnn``, OpenVLA-OFT's L1
  head, SAC's ``rsample``), and the elementwise Gaussian log-density the chains score their steps with;
* ``categorical``: a tempered, top-k categorical over action tokens (``ar_vla``, ``openvla``, ``openvla_oft``);
* ``flow``: the flow-matching chain with its Flow-SDE / Flow-Noise likelihoods (every flow family);
* ``diffusion``: DPPO's denoising chain over a DDPM/DDIM scheduler (``diffusion``).

A policy composes a network (its own module), a processor (``policies.processors``) and one of these.
"""
