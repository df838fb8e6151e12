"""compo-study: compositional understanding of CLIP-like models, end to end.

snakemake --cores all                                    # the embedded-default study
snakemake --cores all results/eval/negclip/coco/seed0/sugarcrepe.json   # one target
snakemake --configfile config/paper.yaml --workflow-profile workflow/profiles/slurm
"""

import os
import sys

from snakemake.utils import min_version

# Every rule runs `python -m compo` from this checkout, whatever provides Python: the venv, a conda env of
# envs/ (--use-conda; the package is not installed there), or the container (--sdm apptainer). So the package
# is put on PYTHONPATH, and `python` is this interpreter's unless an env's activation puts its own first.
# Jobs inherit both (cluster jobs through sbatch --export=ALL, and they parse this file again).
PACKAGE_DIR = os.path.join(workflow.basedir, "workflow")
sys.path.insert(0, PACKAGE_DIR)
for variable, entry in (("PYTHONPATH", PACKAGE_DIR), ("PATH", os.path.dirname(sys.executable))):
    entries = [e for e in os.environ.get(variable, "").split(os.pathsep) if e and e != entry]
    os.environ[variable] = os.pathsep.join([entry, *entries])

from compo import forkserver
from compo.artifacts import model_cache
from compo.config import ConfigError, check_before_compute, validate_workflow_config, with_shared_recipes
from compo.inputs import STAND_INS_ENV, check_input_formats, check_raw_inputs
from compo.prefetch import check_model_cache
from compo.profiles import (
    ProfileError,
    check_rule_names,
    check_workflow_profile,
    destructive_options,
    profiles_in_argv,
)
from compo.provenance import stale_code_warning
from compo.results_root import StudyLock, StudyLockError

min_version("9.20")


# The embedded default, unless config files are given on the command line: config/paper.yaml is a
# complete study of its own, not an overlay (a recursive merge would leak default-only keys into it).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


# The recipes both studies share (config/recipes.yaml) go under whichever study was loaded, whether the default
# above or --configfile's (not a `configfile:` of its own, which would go over a command-line study): its own
# keys win. compo's commands load them the same way (compo.config.load_config).
config.update(with_shared_recipes(config))


# The schema (workflow/schemas/config.schema.yaml) and the cross-reference checks; an error is one line
# naming the file or key (compo.config), not Snakemake's dump of the whole schema or a traceback. Then every
# raw input the config names must exist: one message lists each missing path with its key (compo.inputs),
# before anything is submitted (checked where the DAG is built, not again inside each cluster job); then each
# raw file's first items are parsed (an empty or malformed file named) and every external model the config
# needs must be in the model cache's manifest (compo.prefetch); so are LoRA targets against the base model's
# weights and a writable results root (compo.config.check_before_compute).
try:
    validate_workflow_config(config, workflow.configfiles)
    if workflow.is_main_process:
        check_workflow_profile(sys.argv, workflow.basedir)
        check_raw_inputs(config)
        if not os.environ.get(STAND_INS_ENV):  # compo plan's empty stand-ins (compo.inputs)
            check_input_formats(config)
            check_model_cache(config, workflow.configfiles, model_cache(config))
        check_before_compute(config)
except (ConfigError, ProfileError) as error:
    sys.exit(f"compo-study: {error}")


# One study per results folder (compo.results_root): taken when jobs start, released when the run ends.
STUDY_LOCK = StudyLock(config["results"])
# Model folders built by other code than this checkout's: Snakemake does not see the package's code, so say so
# (compo.provenance; docs/provenance.md).
if workflow.is_main_process:
    STALE_CODE = stale_code_warning(os.path.join(config["results"], "models"))
    if STALE_CODE:
        print(STALE_CODE, file=sys.stderr)
# Deleting or touching outputs (or their metadata) does not start jobs: it takes the lock here, before Snakemake
# acts, so it is refused while a study (from any checkout) runs on these results.
if workflow.is_main_process and (destructive_options(sys.argv[1:]) or workflow.touch):
    try:
        STUDY_LOCK.acquire()
    except StudyLockError as error:
        sys.exit(f"compo-study: {' '.join(destructive_options(sys.argv[1:])) or '--touch'} refused: {error}")


onstart:
    try:
        STUDY_LOCK.acquire()
    except StudyLockError as error:
        sys.exit(f"compo-study: {error}")
    # Local jobs fork from a server that imported torch once (compo.forkserver; COMPO_FORKSERVER=0: off)
    if workflow.local_exec:
        FORK_SERVERS = forkserver.start(os.getpid())
        if FORK_SERVERS:
            os.environ[forkserver.ENV] = FORK_SERVERS


onsuccess:
    STUDY_LOCK.release()
    forkserver.end_of_run()


onerror:
    STUDY_LOCK.release()
    forkserver.end_of_run()


# --software-deployment-method apptainer runs every rule in this image (build it from
# containers/compo-study.def); without that option it is not used.
container: "compo-study.sif"


include: "workflow/rules/common.smk"


# the report opens on the answer: the landing page rule report_tables renders from the results (the kinds of
# effect, the claims' verdict counts) above workflow/report/workflow.rst; that description alone before then
LANDING = os.path.abspath(f"{R}/report/workflow.rst")


report: LANDING if os.path.exists(LANDING) else "workflow/report/workflow.rst"


include: "workflow/rules/world.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/parse.smk"
include: "workflow/rules/concreteness.smk"
include: "workflow/rules/negatives.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/stats.smk"
include: "workflow/rules/wiseft.smk"
include: "workflow/rules/attributes.smk"
include: "workflow/rules/report.smk"


# Rules that only gather or merge small files run on the submitting host in cluster runs.
localrules:
    all,
    benchmark_set,
    wiseft_trajectories,
    negatives_gather,
    negative_images_gather,
    negatives_quality,
    aggregate,


rule all:
    """The whole study named by config `study`: every model evaluated, tables, figures and reports."""
    input:
        STUDY.study_outputs(),
        STUDY.report_outputs(FIGURE_REPORT, DATA_TABLES),
    default_target: True


# A profile's set-resources or set-threads (or --set-resources / --set-threads) naming a rule the workflow does
# not have is an error naming the profile and the rule (Snakemake ignores it; compo.profiles).
if workflow.is_main_process:
    try:
        check_rule_names(
            " and ".join(profiles_in_argv(sys.argv)) or "(the command line)",
            {
                "set-resources": workflow.resource_settings.overwrite_resources,
                "set-threads": workflow.resource_settings.overwrite_threads,
            },
            [rule.name for rule in workflow.rules],
        )
    except ProfileError as error:
        sys.exit(f"compo-study: {error}")
