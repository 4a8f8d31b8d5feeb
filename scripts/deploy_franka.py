"""Deploy a trained vlarl policy on a Franka behind the safety layer (see robots/deploy.py for options).

    python scripts/deploy_franka.py robot=franka robot.franky.ip=<arm address> checkpoint=<policy dir>
"""

import sys

from robots.deploy import main

if __name__ == "__main__":
    sys.exit(main())
