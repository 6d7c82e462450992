import runpy
from pathlib import Path

from setuptools import find_packages, setup

# The tested ranges live in the package, where its first-use warning reads them too; run as a plain file because
# torch, which the package imports, may not be installed yet.
versions = runpy.run_path(str(Path(__file__).with_name("lightning_dist_hooks") / "supported_versions.py"))
supported = {name: name + specifier for name, specifier in versions["SUPPORTED"].items()}

setup(
    name="lightning-dist-hooks",
    version="0.1.0",
    description="Drop-in PyTorch Lightning Trainer with a choice of torch.distributed backend, init method and sampler",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["lightning_dist_hooks", "lightning_dist_hooks.*"]),
    python_requires=versions["PYTHON"],
    # A range, never a point: an installed torch inside it is kept (pip replaces none that satisfies it).
    install_requires=[supported["torch"], supported["pytorch-lightning"]],
    extras_require={
        "mpi": [supported["mpi4py"]],
        # The unified package, for `import lightning as L` and lightning_dist_hooks.lightning.
        "lightning": [supported["lightning"]],
        # LightningCLI's parser, at the version pytorch-lightning's own "extra" asks for.
        "cli": ["jsonargparse[signatures]>=4.39.0"],
        # pytest-xdist runs the suite's files side by side (pytest.ini); expecttest is needed by torch's own backend
        # tests (tests/test_torch_backend_suite.py).
        "test": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "matplotlib>=3.7", "expecttest>=0.2",
                 supported["lightning"], "jsonargparse[signatures]>=4.39.0"],
        "lint": ["ruff==0.17.6", "mypy==2.4.1"],
    },
    entry_points={"console_scripts": ["lightning-dist-hooks-doctor=lightning_dist_hooks.doctor:main"]},
    classifiers=["Programming Language :: Python :: 3", "Topic :: Scientific/Engineering :: Artificial Intelligence"]
    + [f"Programming Language :: Python :: 3.{minor}" for minor in range(10, 14)],
)
