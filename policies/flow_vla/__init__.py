"""Flow-matching VLAs with Flow-SDE / Flow-Noise likelihoods; registers ``policy=flow_vla``.

``policy.architecture``: ``lookalike`` (cross-attention expert over any HF VLM) or an exact network of
``policies.flow_vla.registry`` (``smolvla``, ``pi0``, ``pi05``), built as ``ExactFlowPolicy``.
"""

from policies.flow_vla.exact import ExactFlowPolicy
from policies.flow_vla.modeling import FlowVLAConfig, FlowVLAPolicy

__all__ = ["ExactFlowPolicy", "FlowVLAConfig", "FlowVLAPolicy"]
