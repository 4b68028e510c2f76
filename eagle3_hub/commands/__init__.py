"""The ``eagle3-hub`` subcommands, one module each: ``add_arguments(parser)`` declares the flags and ``run(args)``
turns them into calls of the library. argparse lives here and in ``eagle3_hub.cli`` only."""
