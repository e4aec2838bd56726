"""What every layer stands on: atomic writes and checked reads (``files``), the one reader of tensor
files (``state_files``), the run folder contract (``run_folder``) and the checks of every output a
tool writes (``output_paths``), devices, seeding and mixed precision (``device``), the process group
(``distributed``) and the memory a device has free (``memory``)."""
