from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="lightning-dist-hooks",
    version="0.1.0",
    description="Drop-in PyTorch Lightning Trainer with a choice of torch.distributed backend, init method and sampler",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["lightning_dist_hooks", "lightning_dist_hooks.*"]),
    python_requires=">=3.10",
    # The ranges this package was tested with; _lightning_internals.py names the Lightning internals it reads
    # (TESTED_LIGHTNING there is the same range, for both Lightning packages).
    install_requires=["torch>=2.13,<2.14", "pytorch-lightning>=2.6.6,<2.7"],
    extras_require={
        "mpi": ["mpi4py>=4.0"],
        # The unified package, for `import lightning as L` and lightning_dist_hooks.lightning.
        "lightning": ["lightning>=2.6.6,<2.7"],
        # LightningCLI's parser, at the version pytorch-lightning's own "extra" asks for.
        "cli": ["jsonargparse[signatures]>=4.39.0"],
        "test": ["pytest>=8", "pytest-timeout>=2.3", "matplotlib>=3.7", "lightning>=2.6.6,<2.7",
                 "jsonargparse[signatures]>=4.39.0"],
    },
    entry_points={"console_scripts": ["lightning-dist-hooks-doctor=lightning_dist_hooks.doctor:main"]},
    classifiers=["Programming Language :: Python :: 3", "Topic :: Scientific/Engineering :: Artificial Intelligence"],
)
