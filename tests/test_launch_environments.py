"""`progdesc.distributed.initialize()` without arguments: what `progdesc launch` sets, and the
cluster environments `jax.distributed.initialize()` detects (SLURM, Open MPI, Kubernetes).

The environments are simulated by their variables. In this process, `environments.resolve`
is checked against the values each environment's documented variables give (JAX's rules:
the first node of the step, a port derived from the job id); in the slow cases, two real
processes with those variables pointing at 127.0.0.1 join one run with `initialize()`. What
devices JAX leaves a process is checked by running JAX's own `jax.distributed.initialize`
up to its connection (a stand-in client stops it there).
"""
import os
import subprocess
import sys
import textwrap

import pytest

from lowering.errors import DistributedError
from progdesc import distributed as dist
from progdesc.distributed import environments, launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 180
FIRST_PORT = 65535 - 2 ** 12 + 1      # JAX derives SLURM's and Open MPI's ports in [this, 65535]
ENVIRONMENT_VARIABLES = (
    *environments.LAUNCH_VARIABLES, "JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_PORT",
    "SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID",
    "OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK", "KUBERNETES_SERVICE_HOST", "JOB_COMPLETION_INDEX")


@pytest.fixture
def bare(monkeypatch):
    """No launcher or cluster variable in the environment; `set(**variables)` adds some."""
    for name in ENVIRONMENT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return lambda **variables: [monkeypatch.setenv(k, str(v)) for k, v in variables.items()]


def slurm(job_id, rank, nodes="127.0.0.1"):
    return dict(SLURM_JOB_ID=job_id, SLURM_STEP_NODELIST=nodes, SLURM_NTASKS=2,
                SLURM_PROCID=rank, SLURM_LOCALID=rank)


def open_mpi(job_id, rank, host="127.0.0.1"):
    return dict(OMPI_MCA_orte_hnp_uri=f"{job_id}.0;tcp://{host},10.148.0.1:34911",
                OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_RANK=rank,
                OMPI_COMM_WORLD_LOCAL_RANK=rank)


def test_the_launchers_variables_are_read(bare):
    bare(PROGDESC_COORDINATOR="127.0.0.1:2345", PROGDESC_NUM_PROCESSES=4, PROGDESC_PROCESS_ID=3)
    assert environments.resolve(None, None, None, 10) == ("127.0.0.1:2345", 4, 3,
                                                          "progdesc launch", None)
    # arguments given win; the launcher's variables fill the rest
    assert environments.resolve("10.0.0.1:1", None, 0, 10)[:3] == ("10.0.0.1:1", 4, 0)


def test_slurm_is_detected(bare):
    bare(**slurm(12345, 1, nodes="node[003-004,007],login"))
    assert environments.resolve(None, None, None, 10) == (
        f"node003:{FIRST_PORT + 12345 % 4096}", 2, 1, "the SLURM environment", "SlurmCluster")
    bare(JAX_COORDINATOR_PORT=4321)
    assert environments.resolve(None, None, None, 10)[0] == "node003:4321"
    # progdesc launch inside a SLURM step: the launcher's variables win
    bare(PROGDESC_COORDINATOR="127.0.0.1:2345", PROGDESC_NUM_PROCESSES=3, PROGDESC_PROCESS_ID=2)
    assert environments.resolve(None, None, None, 10) == ("127.0.0.1:2345", 3, 2,
                                                          "progdesc launch", None)


def test_open_mpi_is_detected(bare):
    job = 1531576320      # a multiple of 2**12, as Open MPI's job ids are
    bare(**open_mpi(job, 1, host="10.96.0.1"))
    assert environments.resolve(None, None, None, 10) == (
        f"10.96.0.1:{FIRST_PORT + job // 4096 % 4096}", 2, 1, "the Open MPI environment",
        "OmpiCluster")


def test_nothing_found_and_bad_variables_are_named(bare):
    with pytest.raises(DistributedError, match="initialize was not given coordinator, "
                       "num_processes, process_id and found no environment"):
        dist.initialize()
    bare(PROGDESC_COORDINATOR="127.0.0.1:2345", PROGDESC_NUM_PROCESSES=2)
    with pytest.raises(DistributedError, match="PROGDESC_PROCESS_ID is not set"):
        dist.initialize()
    bare(PROGDESC_PROCESS_ID="one")
    with pytest.raises(DistributedError, match="PROGDESC_PROCESS_ID must hold an int, got 'one'"):
        dist.initialize()
    bare(PROGDESC_PROCESS_ID=2)
    with pytest.raises(DistributedError, match=r"process_id must be an int in \[0, 2\), got 2 "
                       r"\(found in progdesc launch\)"):
        dist.initialize()


# Joins the run initialize() finds, then gathers every process's rank.
JOIN = ["-c", textwrap.dedent("""
    import sys
    import numpy as np
    import jax
    from jax.experimental import multihost_utils
    from progdesc import distributed as dist
    if sys.argv[1] == "kubernetes":     # the namespace file of a pod's service account
        from jax._src.clusters import k8s_cluster
        k8s_cluster.K8sCluster._namespace = classmethod(lambda cls: "training")
    dist.initialize(timeout=60)
    ranks = multihost_utils.process_allgather(np.array([jax.process_index()]))
    print("joined", jax.process_index(), jax.process_count(), ranks.ravel().tolist())
""")]

# A stand-in for the `kubernetes` client package answering as the API server does for a pod
# of an indexed Job of parallelism 2 ("train"): JAX reads the process count there.
KUBERNETES = textwrap.dedent("""
    from types import SimpleNamespace as _Object

    class _ApiException(Exception):
        pass

    class _Core:
        def list_namespaced_pod(self, namespace, field_selector):
            assert namespace == "training" and field_selector == "status.podIP=127.0.0.1"
            owner = _Object(controller=True, kind="Job", name="train")
            pod = _Object(metadata=_Object(name="train-0-x", labels={"job-name": "train"},
                                           owner_references=[owner]),
                          spec=_Object(subdomain="train"))
            return _Object(items=[pod])

    class _Batch:
        def read_namespaced_job(self, name, namespace):
            assert (name, namespace) == ("train", "training")
            return _Object(metadata=_Object(name=name, labels={}),
                           spec=_Object(parallelism=2))

    config = _Object(load_incluster_config=lambda: None)
    client = _Object(CoreV1Api=_Core, BatchV1Api=_Batch,
                     exceptions=_Object(ApiException=_ApiException))
""")


def free_port(first=None):
    """A port free on every address now, in [first, 65535] if `first` is given."""
    port = launch.free_port(first)
    if port is None:
        pytest.skip(f"no free port in [{first}, 65535]")
    return port


def join(variables, kind, extra_path=None):
    """Two processes, each with its own `variables(rank)`, run JOIN; their outputs."""
    procs = []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if k not in ENVIRONMENT_VARIABLES}
        env.update(PYTHONPATH=os.pathsep.join(filter(None, [extra_path, ROOT])),
                   JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1",
                   **{k: str(v) for k, v in variables(rank).items()})
        procs.append(subprocess.Popen([sys.executable, *JOIN, kind], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    try:
        outs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (proc, out) in enumerate(zip(procs, outs)):
        assert proc.returncode == 0, f"process {rank}:\n{out}"
        assert f"joined {rank} 2 [0, 1]" in out, out


@pytest.mark.slow
def test_two_processes_join_in_a_simulated_slurm_step():
    port = free_port(FIRST_PORT)
    join(lambda rank: slurm(port - FIRST_PORT + 4096 * 7, rank), "slurm")


@pytest.mark.slow
def test_two_processes_join_under_a_simulated_mpirun():
    port = free_port(FIRST_PORT)
    join(lambda rank: open_mpi((port - FIRST_PORT + 4096) * 4096, rank), "ompi")


@pytest.mark.slow
def test_two_processes_join_in_a_simulated_kubernetes_indexed_job(tmp_path):
    """The process count comes from the Job (through the stand-in API client), the rank
    from JOB_COMPLETION_INDEX; the coordinator from JAX_COORDINATOR_ADDRESS, as the pod
    name JAX derives (train-0.train) does not resolve here."""
    (tmp_path / "kubernetes.py").write_text(KUBERNETES)
    port = free_port()
    join(lambda rank: dict(KUBERNETES_SERVICE_HOST="127.0.0.1", HOSTNAME="localhost",
                           JOB_COMPLETION_INDEX=rank,
                           JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}"),
         "kubernetes", extra_path=str(tmp_path))


def test_on_a_jax_without_its_cluster_registry_the_error_says_what_to_pass(bare, monkeypatch):
    import types
    from lowering.errors import JaxCompatError
    monkeypatch.setitem(sys.modules, "jax._src.clusters", types.ModuleType("jax._src.clusters"))
    with pytest.raises(JaxCompatError, match=r"jax\._src\.clusters\.ClusterEnv.*pass "
                       "coordinator, num_processes and process_id"):
        environments.resolve(None, None, None, 10)
    # the launcher's variables need no detection
    bare(PROGDESC_COORDINATOR="127.0.0.1:2345", PROGDESC_NUM_PROCESSES=2, PROGDESC_PROCESS_ID=1)
    assert environments.resolve(None, None, None, 10)[:3] == ("127.0.0.1:2345", 2, 1)


def test_on_a_jax_whose_detection_takes_other_arguments_the_error_names_it(bare, monkeypatch):
    import types
    from jax._src import clusters
    from lowering.errors import JaxCompatError

    class Other:
        _cluster_types = clusters.ClusterEnv._cluster_types

        @classmethod
        def auto_detect_unset_distributed_params(cls, address, count):
            raise AssertionError("not to be called")
    monkeypatch.setitem(sys.modules, "jax._src.clusters",
                        types.SimpleNamespace(ClusterEnv=Other))
    with pytest.raises(JaxCompatError, match="auto_detect_unset_distributed_params"):
        environments.resolve(None, None, None, 10)


class Joining(Exception):
    """Raised where JAX would connect to the coordinator: the fake client's answer."""


@pytest.fixture
def visible_devices(monkeypatch):
    """`initialize()` runs JAX's own `jax.distributed.initialize` on a fresh distributed state
    up to the connection (the client raises Joining); returns a function that calls it and
    gives the devices JAX then lets this process see (`jax_cuda_visible_devices`)."""
    import jax
    from jax._src import distributed, xla_bridge
    monkeypatch.setattr(distributed, "global_state", distributed.State())
    monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: False)

    def no_connection(*args, **kwargs):
        raise Joining
    monkeypatch.setattr(distributed._jax, "get_distributed_runtime_client", no_connection)
    before = {name: getattr(jax.config, name, None) for name in (
        "jax_cpu_collectives_implementation", "jax_rocm_visible_devices")}
    before["jax_cuda_visible_devices"] = xla_bridge.CUDA_VISIBLE_DEVICES.value

    def run(*args, **kwargs):
        jax.config.update("jax_cuda_visible_devices", "all")     # JAX's default
        with pytest.raises(Joining):
            dist.initialize(*args, **kwargs)
        return xla_bridge.CUDA_VISIBLE_DEVICES.value
    yield run
    for name, value in before.items():
        if value is not None:
            jax.config.update(name, value)


def test_jaxs_detection_does_not_pick_devices_for_the_launchers_processes(bare,
                                                                         visible_devices):
    """`progdesc launch` inside a SLURM step: the step's variables (SLURM_LOCALID 0 in every
    process of the launcher) do not narrow what the processes see, nor do they with all
    arguments given; values found in the SLURM step alone keep JAX's one device per task."""
    bare(**slurm(12345, 1))
    assert visible_devices(timeout=5) == "1"                 # JAX's rule: SLURM_LOCALID
    bare(PROGDESC_COORDINATOR="127.0.0.1:2345", PROGDESC_NUM_PROCESSES=3, PROGDESC_PROCESS_ID=2,
         SLURM_LOCALID=0)
    assert visible_devices(timeout=5) == "all"
    assert visible_devices("127.0.0.1:2345", 3, 1, timeout=5) == "all"
    assert visible_devices(timeout=5, local_device_ids=[1]) == "1"
