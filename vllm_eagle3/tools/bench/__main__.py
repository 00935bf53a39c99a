"""``python -m vllm_eagle3.tools.bench`` = ``vllm-eagle3 bench``."""

import sys

from vllm_eagle3.tools.bench.cli import main

sys.exit(main())
