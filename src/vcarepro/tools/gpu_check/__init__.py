"""The GPU acceptance check (``vcarepro gpu-check``, ``python -m vcarepro.tools.gpu_check``; :mod:`.cli`'s
docstring is the command's help): every paper-scale path that has only run on CPUs, run once on a new GPU machine
before the first real job, each part passing or failing with a one-line reason. One concept a module:

    cli         the command: its options, the parts chosen, the budget, the JSON and Markdown it writes
    parts       the parts run one after another, each in its own thread under its share of the budget
    steps       the smoke matrix's distinct runs stepped at paper shape in their recipes' precision and compile;
                the preflight's step time and peak memory of the proxy and paper runs at the recipe's batch
    ddp         one DDP step through torchrun on one device (NCCL on a GPU, gloo on a CPU)
    ddp_worker  the script torchrun starts for that step
    fid         the SD-VAE-shaped stand-in's encode and decode, and FID through the project's evaluator
    attention   one layer of each family member against timm's fused MHSA, in bf16; torch.profiler's slowest ops
    report      the Markdown table of everything the JSON holds

On a CPU it runs at tiny sizes (``--tiny``, forced without CUDA): every part's code path, none of its numbers.
"""
