/*
 * testhooks.h — the one place the CLI reads the HP_TEST_* environment: hyperpar's own tests drive a process
 * through these variables (docs/reliability.md). The library reads no environment for a test hook; main installs
 * the library's hooks from here (hp_test_hooks_install), and run and train take the runner's from here.
 */
#ifndef HP_TOOLS_TESTHOOKS_H
#define HP_TOOLS_TESTHOOKS_H

#include <stdbool.h>

/* Reads HP_TEST_ONLY_RANK, HP_TEST_ENOSPC_AFTER, the HP_TEST_PAUSE_* and HP_MPI_* variables and installs them as
 * the library's test hooks (hyperpar/core.h, hp_test_hooks). main calls it once, before anything else. */
void cli_test_hooks_install(void);

/* The runner's test hooks (hp_run_opts' test_* fields), from the environment; NULL / false when unset. */
typedef struct cli_test_env {
    const char *perturb_boundary; /* HP_TEST_PERTURB_BOUNDARY=<fqn>: validate's perturbed boundary */
    const char *perturb_grad;     /* HP_TEST_PERTURB_GRAD=<fqn>: validate --backward's nudged gradient */
    bool mlp_whole;               /* HP_TEST_MLP_WHOLE=1: the dense MLP on all rows at once */
    const char *nan_grad;         /* HP_TEST_NAN_GRAD=<fqn>: train's NaN gradient */
} cli_test_env;
cli_test_env cli_test_env_get(void);

#endif
