# A team GPU box without Kubernetes: JupyterHub with a local spawner, each user picking a GPU
# budget, every user's server sharing one node ledger. Copy to /etc/jupyterhub/ and adapt.
from jupyter_gpushare.hub import budget_environment, budget_from_form, budget_options_form

c = get_config()  # type: ignore[name-defined]  # noqa: F821

BUDGETS = ["4G", "8G", "16G", "32G"]
# One ledger for the node, shared through the group gpu-users as docs/admins/team-box.md sets it
# up ("With one shared ledger file"). Users see only their own kernels in detail; others' slices
# appear as reserved memory.
LEDGER = "/var/lib/gpushare-team/ledger.sqlite"

c.JupyterHub.spawner_class = "jupyterhub.spawner.LocalProcessSpawner"
c.Spawner.options_form = budget_options_form(BUDGETS, default="8G")


def options_from_form(formdata):  # type: ignore[no-untyped-def]
    return budget_from_form(formdata, BUDGETS)


c.Spawner.options_from_form = options_from_form


def pre_spawn_hook(spawner):  # type: ignore[no-untyped-def]
    # The user's server holds all its kernels to the chosen budget (GPUShare.max_memory_per_user).
    spawner.environment.update(budget_environment(spawner.user_options, LEDGER))


c.Spawner.pre_spawn_hook = pre_spawn_hook
c.Spawner.default_url = "/lab"
