"""Builds the tessera package with libtessera-client inside it.

The library is compiled from node/client/client.c as an extension of the
package (tessera/_libtessera_client*.so) and loaded with ctypes, so the
installed package needs no TESSERA_CLIENT_LIB, PYTHONPATH or installed
prefix. setuptools' build and metadata folders go to a temporary
directory, never into the source tree. The version is tessera's release
(proto/cli.h, PROTO_RELEASE).
"""
import atexit
import os
import re
import shutil
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def release():
    with open(os.path.join(ROOT, "proto", "cli.h")) as f:
        m = re.search(r'^#define PROTO_RELEASE "([^"]+)"', f.read(), re.M)
    if m is None:
        raise SystemExit("setup.py: no PROTO_RELEASE in proto/cli.h")
    return m.group(1)


class BuildClient(build_ext):
    """Compiles the client from its own folder: setuptools takes sources
    only below setup.py, yet the C library lives in node/client."""

    def build_extension(self, ext):
        ext.sources = [os.path.join(ROOT, "node", "client", "client.c")]
        super().build_extension(ext)


scratch = tempfile.mkdtemp(prefix="tessera-py-build-")
atexit.register(shutil.rmtree, scratch, True)

setup(
    version=release(),
    packages=["tessera"],
    ext_modules=[Extension(
        "tessera._libtessera_client",
        sources=["../client/client.c"],  # made absolute by BuildClient
        include_dirs=[ROOT],
        define_macros=[("_GNU_SOURCE", None)],
        extra_compile_args=["-std=gnu11", "-pthread", "-fvisibility=hidden"],
        extra_link_args=["-pthread"],
    )],
    cmdclass={"build_ext": BuildClient},
    options={"build": {"build_base": os.path.join(scratch, "build")},
             "egg_info": {"egg_base": scratch}},
)
