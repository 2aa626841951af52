"""Many runs: an experiment file (seeds x methods x configs x flag overrides) run as Ray tasks, on this machine or
a Ray cluster, from a resumable queue in one experiment folder.

    python -m continual.launch experiment.json [--address ADDR] [--folder DIR] [--resume-id N]

experiment.py: the file's schema, validation and grid expansion; queue.py: claims, heartbeats and status files;
ray_runner.py: Ray and the task that runs one training command; launcher.py: the loop, the table, the CLI.
"""
