"""RL heads: the likelihood part of a policy, given its network's outputs.

``gaussian``: a diagonal Gaussian over a chunk, optionally tanh-squashed (``mlp``, ``cnn``, OpenVLA-OFT's L1 head,
SAC's ``rsample``).
"""
