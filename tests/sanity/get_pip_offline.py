"""Stand-in for the get-pip.py bootstrap script that ansible-test downloads.

ansible-test bootstraps pip in each sanity virtual environment with a get-pip.py fetched
from its own download site. Where only package registries are reachable, this script takes
its place: it installs pip from the interpreter's bundled ensurepip wheel, then runs
``pip install`` with the arguments ansible-test passes (minus get-pip's own flags).
"""

import subprocess
import sys

GET_PIP_ONLY_FLAGS = ('--no-setuptools', '--no-wheel')


def main():
    subprocess.check_call([sys.executable, '-m', 'ensurepip', '--upgrade', '--default-pip'],
                          stdout=subprocess.DEVNULL)
    args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY_FLAGS]
    subprocess.check_call([sys.executable, '-m', 'pip', 'install', '--quiet'] + args)


if __name__ == '__main__':
    main()
