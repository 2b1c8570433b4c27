"""The client's build: the gRPC stubs are generated from the proto into every wheel and sdist, so
`pip install ./client` (or a git URL with `#subdirectory=client`) works from a clean checkout.
Everything else is in pyproject.toml."""

import os
import pathlib
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_stubs  # noqa: E402 - beside this file, not part of the package


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:  # an editable install imports the stubs from the source tree
            gen_stubs.generate(gen_stubs.proto_root(), pathlib.Path(self.build_lib) / "rmscore_client" / "v1")


class SdistWithProto(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        dest = pathlib.Path(base_dir) / "proto" / gen_stubs.PROTO
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(gen_stubs.proto_root() / gen_stubs.PROTO, dest)


setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto})
