"""``python -m framework.projection APP NAME DATA [options]``: run one worker process.

(The same as ``python -m framework.projection.worker``, without runpy's warning about the
module being imported by its package first.)
"""

import sys

from framework.projection.worker import worker_main

sys.exit(worker_main())
