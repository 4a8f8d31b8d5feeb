"""Ray cluster start-up and placement of workers on devices."""

from vlarl.scheduler.cluster import Placement, plan, remote, start_ray, stop_ray

__all__ = ["Placement", "plan", "remote", "start_ray", "stop_ray"]
