"""Packaging for nxdi-gptoss-fp8. The validator needs nothing but the standard library;
loading and converting need torch (install the pinned CPU build first, see README)."""

from setuptools import find_packages, setup

setup(
    name="nxdi-gptoss-fp8",
    version="0.1.0",
    description="Fail-closed validation, zero-copy loading and conversion of normalized static-FP8 "
    "GPT-OSS checkpoints for AWS NeuronX Distributed Inference",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["nxdi_gptoss_fp8", "nxdi_gptoss_fp8.*"]),
    package_data={"nxdi_gptoss_fp8": ["py.typed"]},
    install_requires=[],
    extras_require={
        # torch is not pinned here: install the build you need first (CPU: torch==2.13.0).
        "torch": ["torch>=2.1", "safetensors>=0.4.3", "numpy>=1.24", "tqdm>=4.60"],
        "neuron": ["neuronx-distributed", "torch-neuronx"],
        # converting from a Hub repo id (`convert openai/gpt-oss-120b OUT`)
        "hub": ["huggingface_hub>=0.20"],
        # selfcheck / check-forward: transformers' GptOssForCausalLM is the reference model
        "forward": ["torch>=2.1", "safetensors>=0.4.3", "numpy>=1.24", "tqdm>=4.60", "transformers>=4.55"],
        "test": [
            "torch>=2.1", "safetensors>=0.4.3", "numpy>=1.24", "tqdm>=4.60",
            "pytest>=7.4", "hypothesis>=6.80", "ruff>=0.4", "huggingface_hub>=0.20",
        ],
    },
    entry_points={
        "console_scripts": ["nxdi-gptoss-fp8=nxdi_gptoss_fp8.cli:main"],
        "vllm.general_plugins": ["nxdi_gptoss_fp8 = nxdi_gptoss_fp8.vllm_plugin:register_plugin"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
