"""Episodes on disk in the LeRobot v3.0 format: its layout and reader (``lerobot_v3``) and its writer
(``lerobot_writer``).

Why here: every producer of episodes must be able to write them. ``policies`` is the lowest package that
produces episodes itself (the critic's saved rollouts) and reads them (SFT), and ``vlarl`` (``vlarl-collect``,
evaluation) imports it freely. ``robots`` may import nothing of ``policies`` but ``policies.base``, so the
robot recorder takes the writer from whoever builds it (``robots.recorder.LeRobotEpisodeRecorder(writer)``).
Nothing here imports torch or a model: numpy, pyarrow and the ffmpeg binary of ``imageio-ffmpeg``.
"""
