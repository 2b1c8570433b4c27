"""The server's build: its gRPC stubs (rmscore.v1) are generated from the one proto into every
wheel, so the server owns what it serves instead of taking the client's. It builds from a checkout
(the proto and the generator, client/gen_stubs.py, beside it). Everything else is in pyproject.toml."""

import pathlib
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "client"))
import gen_stubs  # noqa: E402 - the client's generator, not part of either package


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:  # an editable install imports the stubs from the source tree
            gen_stubs.generate(HERE / "proto", pathlib.Path(self.build_lib) / "rmscore" / "v1", "rmscore.v1")


setup(cmdclass={"build_py": BuildPyWithStubs})
