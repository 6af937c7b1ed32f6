"""Where a launch writes: directories walked safely, torchrun's log layout, one launch's run
directories.

- ``safedir``: ``open_directory`` (a path walked one component at a time, refused when another
  user could change it), ``Directory`` (files relative to its descriptor), ``replace_file``
  (a file named on the command line written beside its target and renamed into place),
  ``remove_tree``. Also used by ``numarun.cli`` (``--svg``, ``snapshot OUT``).
- ``logdir``: torchrun's log-directory layout, numarun's temporary directory, attempt
  directories; one run directory per node on a shared ``--log-dir``.
- ``rundirs``: ``RunDirs``, one launch's log directories from first to last.

May import: ``numarun.cmdline`` (the configuration, for types), the base and this package.
"""
