"""Packaging for nxdi-gptoss-fp8. The validator needs nothing but the standard library;
loading, converting and make-tiny need torch (install the build you need first, see
docs/install.md); running a model needs the AWS Neuron SDK, which this package never installs."""

import os
import re

from setuptools import Extension, find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
# The format document: one copy in the source tree (docs/format.md), shipped inside the package
# as nxdi_gptoss_fp8/format.md, where runtime messages and `nxdi-gptoss-fp8 --help` find it.
FORMAT_DOCUMENT = os.path.join("docs", "format.md")
# PyPI shows the README as the project's description, where a relative link leads nowhere: each
# relative link target becomes the repository's copy of the file on the main branch.
REPOSITORY_FILES = "https://github.com/nxdi-gptoss-fp8/nxdi-gptoss-fp8/blob/main/"
RELATIVE_LINK = re.compile(r"(\]\()(?![a-zA-Z][a-zA-Z0-9+.-]*:|#)([^)\s]+)\)")


def long_description() -> str:
    """The README with its relative links made absolute (``docs/x.md#y`` → the repository's)."""
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as handle:
        readme = handle.read()
    return RELATIVE_LINK.sub(lambda m: f"{m.group(1)}{REPOSITORY_FILES}{m.group(2)})", readme)


class BuildWithFormatDocument(build_py):
    """build_py that also copies docs/format.md into the built package (wheels, installs)."""

    def run(self) -> None:
        super().run()
        target = os.path.join(self.build_lib, "nxdi_gptoss_fp8", "format.md")
        self.mkpath(os.path.dirname(target))
        self.copy_file(os.path.join(HERE, FORMAT_DOCUMENT), target)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, "nxdi_gptoss_fp8", "format.md")]


# The converter's one-pass encoders (nxdi_gptoss_fp8/convert/_kernels.c, plain C, loaded through
# ctypes): optional — where no C compiler works (none installed, CC=false) the build warns and the
# install goes on; the converter then runs its torch path (convert/kernels.py says which).
KERNELS = Extension("nxdi_gptoss_fp8.convert._kernels", sources=["nxdi_gptoss_fp8/convert/_kernels.c"],
                    extra_compile_args=["-O3"], optional=True)


setup(
    name="nxdi-gptoss-fp8",
    version="0.6.0",
    description="Fail-closed validation, zero-copy loading and conversion of normalized static-FP8 "
    "GPT-OSS checkpoints for AWS NeuronX Distributed Inference",
    long_description=long_description(),
    long_description_content_type="text/markdown",
    author="the nxdi-gptoss-fp8 authors",
    license="Apache-2.0",
    url="https://github.com/nxdi-gptoss-fp8/nxdi-gptoss-fp8",
    project_urls={
        "Format": "https://github.com/nxdi-gptoss-fp8/nxdi-gptoss-fp8/blob/main/docs/format.md",
        "Changelog": "https://github.com/nxdi-gptoss-fp8/nxdi-gptoss-fp8/blob/main/CHANGELOG.md",
    },
    python_requires=">=3.10",
    packages=find_packages(include=["nxdi_gptoss_fp8", "nxdi_gptoss_fp8.*"]),
    package_data={"nxdi_gptoss_fp8": ["py.typed", "format.md"]},
    cmdclass={"build_py": BuildWithFormatDocument},
    ext_modules=[KERNELS],
    install_requires=[],
    extras_require={
        # install the torch build you need first (CPU index, or torch-neuronx's on a Neuron host):
        # an installed torch >= 2.1 satisfies these, otherwise pip takes the index's default build.
        "torch": ["torch>=2.1", "safetensors>=0.4.3", "numpy>=1.24", "tqdm>=4.60"],
        # a Hub repo id: converting from it (`convert openai/gpt-oss-120b OUT`), validating it without a
        # download (`validate ORG/REPO`); 0.x (what transformers 4.57 pins) and 2.x both work
        "hub": ["huggingface_hub>=0.20"],
        # selfcheck / check-forward: transformers' GptOssForCausalLM is the reference model
        # (< 5: NxDI pins transformers 4.57.*, and v5 changed GPT-OSS's expert layout)
        "forward": ["torch>=2.1", "safetensors>=0.4.3", "numpy>=1.24", "tqdm>=4.60", "transformers>=4.55,<5"],
        # selfcheck / check-forward on a CPU host with NxDI and NxD from their sources: what NxD
        # imports at package import beyond the above (found by importing it in a fresh virtualenv)
        "nxdi-cpu": ["torch>=2.1", "safetensors>=0.4.3", "numpy>=1.24", "tqdm>=4.60", "transformers>=4.55,<5",
                     "boto3>=1.26", "tenacity>=8"],
        "test": [
            "torch>=2.1", "safetensors>=0.4.3", "numpy>=1.24", "tqdm>=4.60",
            "pytest>=7.4", "hypothesis>=6.80", "ruff>=0.4", "huggingface_hub>=0.20",
            "setuptools>=70.1",  # the packaging test builds the wheel (bdist_wheel is built in from 70.1)
            # imported by NxDI's own modules in the nxdi tests (NXDI_SRC); NxDI pins 4.57.*
            "transformers>=4.55,<5",
            # the model card's front matter is read back with a YAML parser
            "pyyaml>=5.1",
            # NxD imports them at package import: the NxDI CPU-mode tests (NXDI_SRC, NXD_SRC)
            "boto3>=1.26", "tenacity>=8",
        ],
    },
    entry_points={
        "console_scripts": ["nxdi-gptoss-fp8=nxdi_gptoss_fp8.cli:main"],
        "vllm.general_plugins": ["nxdi_gptoss_fp8 = nxdi_gptoss_fp8.nxdi.vllm_plugin:register_plugin"],
    },
    classifiers=[
        "License :: OSI Approved :: Apache Software License",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
