"""Where `initialize()` finds the coordinator, process count and rank it is not given.

In order, each filling only what is still missing:

1. the arguments of `initialize`;
2. the variables `progdesc launch` sets in each process it starts (`COORDINATOR`,
   `NUM_PROCESSES`, `PROCESS_ID` below);
3. `JAX_COORDINATOR_ADDRESS`, which `jax.distributed.initialize` reads too;
4. the cluster environments `jax.distributed.initialize()` detects, detected by JAX's own
   code (`jax_compat.detect_cluster`): SLURM (`SLURM_JOB_ID`, `SLURM_STEP_NODELIST`,
   `SLURM_NTASKS`, `SLURM_PROCID`, `SLURM_LOCALID`), Open MPI's `mpirun`
   (`OMPI_MCA_orte_hnp_uri`, `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_RANK`), a Kubernetes
   indexed Job (`KUBERNETES_SERVICE_HOST`, `JOB_COMPLETION_INDEX` and the pod's Job, read
   through the `kubernetes` package), Cloud TPU. `JAX_COORDINATOR_PORT` overrides the port
   JAX derives there.

Only in case 4 does `initialize` let `jax.distributed.initialize` run its own detection too
(which then also picks `local_device_ids`, one device per process where the environment
says the process's local rank: SLURM_LOCALID...). With values from 1 to 3 it is turned off,
so that variables of an enclosing SLURM step or mpirun do not restrict every process started
by `progdesc launch` to the same device.
"""
import collections
import os

from lowering.errors import DistributedError, JaxCompatError
from progdesc import jax_compat

COORDINATOR = "PROGDESC_COORDINATOR"
NUM_PROCESSES = "PROGDESC_NUM_PROCESSES"
PROCESS_ID = "PROGDESC_PROCESS_ID"
LAUNCH_VARIABLES = (COORDINATOR, NUM_PROCESSES, PROCESS_ID)

_NAMES = {"SlurmCluster": "SLURM", "OmpiCluster": "Open MPI", "K8sCluster": "Kubernetes",
          "GkeTpuCluster": "GKE TPU", "GceTpuCluster": "Cloud TPU"}


Found = collections.namedtuple(
    "Found", "coordinator num_processes process_id source cluster")
Found.__doc__ = """What `resolve` found: the three values, where they came from (words), and
the cluster environment JAX detected (its class name: "SlurmCluster"...), None if none was
asked."""


def resolve(coordinator, num_processes, process_id, timeout):
    """A `Found` for `initialize`: the arguments given, the rest found as the module
    docstring says. DistributedError if one is still missing, or a variable does not hold
    what it should."""
    values = [coordinator, num_processes, process_id]
    sources, found = [], None
    if None in values and any(name in os.environ for name in LAUNCH_VARIABLES):
        values = [given if given is not None else _launch_variable(name, parse)
                  for given, name, parse in zip(values, LAUNCH_VARIABLES, (str, int, int))]
        sources.append("progdesc launch")
    if values[0] is None and os.environ.get("JAX_COORDINATOR_ADDRESS"):
        values[0] = os.environ["JAX_COORDINATOR_ADDRESS"]
        sources.append("JAX_COORDINATOR_ADDRESS")
    if None in values:
        try:
            found, *values = jax_compat.detect_cluster(*values, timeout)
        except JaxCompatError:
            raise
        except Exception as e:  # noqa: BLE001  (JAX's detection raises what its environment raises)
            raise DistributedError(f"initialize found a cluster environment but could not read "
                                   f"it: {type(e).__name__}: {e}") from None
        if found is not None:
            sources.append(f"the {_NAMES.get(found, found)} environment")
    missing = [name for name, value in zip(("coordinator", "num_processes", "process_id"), values)
               if value is None]
    if missing:
        raise DistributedError(
            f"initialize was not given {', '.join(missing)} and found no environment that "
            "says: start the script with 'progdesc launch', in a SLURM step (srun), under Open "
            "MPI's mpirun or in a Kubernetes indexed Job, or pass coordinator, num_processes "
            "and process_id")
    return Found(*values, " and ".join(sources) or "the arguments", found)


def _launch_variable(name, parse):
    text = os.environ.get(name)
    if text is None:
        raise DistributedError(f"{name} is not set while {', '.join(LAUNCH_VARIABLES)} "
                               "should be set together (as 'progdesc launch' sets them)")
    try:
        return parse(text)
    except ValueError:
        raise DistributedError(f"{name} must hold an int, got {text!r}") from None
