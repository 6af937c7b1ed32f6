"""What the machine is: CPUs, SMT siblings, L3 complexes, packages, NUMA nodes, GPUs and NICs.

Read from sysfs (and, where a driver answers, NVML) once, into frozen values; nothing here has
an effect on any process. The vocabulary follows hwloc's object model: Machine > Package >
NUMANode > L3 (``CacheGroup``) > Core > PU (``Cpu``).

- ``cpulist``: the kernel's CPU-list format (``"0-3,8"``), both ways.
- ``model``: the frozen values (``Topology``, ``Cpu``, ``Core``, ``CacheGroup``, ``Package``,
  ``NumaNode``, ``Gpu``, ``Nic``).
- ``topology``: ``read_topology(root)`` from a sysfs tree; which GPUs a process sees
  (``CUDA_VISIBLE_DEVICES`` and friends); ``snapshot`` of a tree for later.
- ``nvml``: optional names and UUIDs of NVIDIA GPUs (nvidia-ml-py); never CUDA, never torch.
- ``topotext``: what ``numarun topo`` prints (text with the GPU/NIC affinity matrix, JSON).
- ``toposvg``: the machine as an SVG picture of nested boxes (``numarun topo --svg``).

May import: ``numarun.errors`` and this package. Nothing above it (placement, process, ...).
"""
