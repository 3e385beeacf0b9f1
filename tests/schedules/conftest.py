import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # sched_app, for the tests and the processes
