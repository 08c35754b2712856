/*
 * ckpt.c — a training run's checkpoints (hyperpar/trainckpt.h, docs/train.md "Checkpoints and resume"):
 *
 *   bind     what binds the run's checkpoints: its id (new, or the resumed checkpoint's), its data's identity
 *            (size and XXH64 of the bytes) and its model's config; a run folder holds one run's checkpoints
 *   save     OUT/step-<t>: every rank's training state, the model folder, then state.json (the flags below),
 *            as one folder that appears whole or not at all
 *   resume   state.json's flags must be this run's (each difference named, with the command and mesh that
 *            saved it), its model config the same, and every file the one saved (hashes) before anything is
 *            restored; --steps may be raised (the schedule then follows the new total)
 */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "trainer.h"
#include "hyperpar/trainckpt.h"

/* "exact", "bf16": how state.json names the compute mode. */
static const char *compute_name(hp_linalg_mode m) { return m == HP_LINALG_BF16 ? "bf16" : "exact"; }

/* The flags a resumed run must share with the saved one, as state.json records them. */
static json_t *run_flags(const hp_trainer *t)
{
    const hp_train_config *a = &t->c;
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "steps", json_integer((json_int_t)a->steps));
    json_object_set_new(o, "world", json_integer(t->world));
    json_object_set_new(o, "lr", json_real(t->sched.lr));
    json_object_set_new(o, "min_lr", json_real(t->sched.min_lr));
    json_object_set_new(o, "schedule", json_string(hp_lr_kind_name(t->sched.kind)));
    json_object_set_new(o, "warmup", json_integer((json_int_t)t->sched.warmup));
    json_object_set_new(o, "beta1", json_real(t->to.beta1));
    json_object_set_new(o, "beta2", json_real(t->to.beta2));
    json_object_set_new(o, "eps", json_real(t->to.eps));
    json_object_set_new(o, "weight_decay", json_real(t->to.weight_decay));
    json_object_set_new(o, "clip", json_real(t->to.clip));
    json_object_set_new(o, "zero", json_integer(t->to.zero));
    json_object_set_new(o, "compute", json_string(compute_name(a->compute)));
    /* the data by what it holds, not by its spelling: another path to the same bytes is the same data (--text:
     * the token stream it was tokenized into, and its mask) */
    const char *dp = a->data ? a->data : a->input ? a->input : "";
    size_t dl = strlen(dp);
    const char *kind = a->text ? (a->loss_mask ? "text tokens, loss mask" : "text tokens")
                       : a->input || (dl >= 12 && !strcmp(dp + dl - 12, ".safetensors")) ? "input_ids"
                       : a->dtype == HP_DATA_U32 ? "uint32" : "uint16";
    json_object_set_new(o, "data", json_pack("{s:I, s:s, s:s}", "bytes", (json_int_t)t->data_bytes, "xxh64",
                                             t->data_sum, "dtype", kind));
    json_object_set_new(o, "seq", json_integer((json_int_t)a->seq));
    json_object_set_new(o, "global_batch", json_integer((json_int_t)a->global_batch));
    json_object_set_new(o, "micro_batch", json_integer((json_int_t)a->micro_batch)); /* per replica, as given */
    json_object_set_new(o, "shuffle", json_string(a->order.shuffle == HP_DATA_IN_ORDER ? "none" : "seeded"));
    char seed[24]; /* the whole unsigned 64-bit range, as given */
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)a->order.seed);
    json_object_set_new(o, "seed", json_string(seed));
    return o;
}

/* A config value as a message shows it: a number as the user wrote it (1e-06, not 9.9999999999999995e-7). */
static const char *value_text(json_t *v, char *buf, size_t cap)
{
    if (!v) snprintf(buf, cap, "(none)");
    else if (json_is_real(v)) snprintf(buf, cap, "%.15g", json_real_value(v));
    else {
        char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        snprintf(buf, cap, "%s", s ? s : "?");
        free(s);
    }
    return buf;
}

/* The model of this run must be the saved run's: its config (hp_train_model_config) equal to the one state.json
 * records, the first differing key named (another rms_norm_eps, rope_theta or family with the same shapes trains
 * another model on the saved weights). */
static hp_status same_model(const hp_trainer *t, const char *ckpt, json_t *saved, hp_err *err)
{
    json_t *mine = t->model_config ? json_loads(t->model_config, 0, NULL) : NULL;
    hp_status st = HP_OK;
    if (!json_is_object(saved))
        st = hp_err_set(err, HP_ERR_INPUT, "--resume %s: state.json records no model_config; it cannot tell whether "
                        "%s is the model it trained", ckpt, t->c.model);
    else if (!mine) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int pass = 0; st == HP_OK && pass < 2; pass++) { /* keys of the saved config, then keys only this one has */
        const char *key;
        json_t *v;
        json_object_foreach(pass ? mine : saved, key, v) {
            json_t *o = json_object_get(pass ? saved : mine, key);
            if (o && (json_is_number(o) && json_is_number(v) ? json_number_value(o) == json_number_value(v)
                                                              : json_equal(o, v)))
                continue; /* (10000 and 10000.0 are one rope_theta) */
            json_t *had = pass ? o : v, *now = pass ? v : o;
            char h[256], n[256];
            st = hp_err_set(err, HP_ERR_INPUT, "--resume %s: the run trained a model whose config.json has %s %s; %s's "
                            "has %s: resume with the model the run began from", ckpt, key, value_text(had, h, sizeof h),
                            t->c.model, value_text(now, n, sizeof n));
            break;
        }
    }
    json_decref(mine);
    return st;
}

/* The first flag of `want` that state.json's `flags` does not share (root: the state, for the command and mesh
 * that saved it), as an error; *saved_steps gets another --steps (raising it is allowed). */
static hp_status same_flags(const hp_trainer *t, const char *ckpt, json_t *root, json_t *flags, json_t *want,
                            int64_t *saved_steps, hp_err *err)
{
    const hp_train_config *a = &t->c;
    const char *key;
    json_t *v;
    json_object_foreach(want, key, v) {
        json_t *had = json_object_get(flags, key);
        if (had && json_equal(had, v)) continue;
        if (!had && !strcmp(key, "compute") && a->compute == HP_LINALG_EXACT) continue; /* saved before --compute */
        if (had && json_is_integer(had) && !strcmp(key, "steps")) { /* another total: checked by the caller */
            *saved_steps = (int64_t)json_integer_value(had);
            continue;
        }
        char *h = had ? json_dumps(had, JSON_ENCODE_ANY) : NULL, *n = json_dumps(v, JSON_ENCODE_ANY);
        if (!strcmp(key, "data"))
            hp_err_set(err, HP_ERR_INPUT, "--resume %s: the run was saved training on other data: %s there, %s %s has "
                       "%s; resume with the saved run's data (its bytes, wherever the file is)", ckpt, h ? h : "(none)",
                       a->data ? "--data" : a->text ? "--text" : "--input", a->data ? a->data : a->text ? a->text
                       : a->input, n ? n : "?");
        else
            hp_err_set(err, HP_ERR_INPUT, "--resume %s: the run was saved with %s %s, this one has %s; resume with the "
                       "saved run's flags", ckpt, key, h ? h : "(none)", n ? n : "?");
        free(h), free(n);
        json_t *cmd = json_object_get(root, "command"), *mesh = json_object_get(root, "mesh");
        size_t l = strlen(err->msg);
        if (json_is_string(cmd) && l < sizeof err->msg)
            snprintf(err->msg + l, sizeof err->msg - l, "; it was saved by: %s%s%s", json_string_value(cmd),
                     json_is_string(mesh) ? ", on mesh " : "", json_is_string(mesh) ? json_string_value(mesh) : "");
        return HP_ERR_INPUT;
    }
    return HP_OK;
}

/* The step state.json of ckpt records, after checking that its flags are this run's (each difference named, with
 * the command line and mesh that saved it). --steps may be raised: *saved_steps then gets the saved run's total
 * (0 when the same), the schedule following the new one. */
static hp_status read_checkpoint(const hp_trainer *t, const char *ckpt, int64_t *step, int64_t *saved_steps,
                                 hp_err *err)
{
    *saved_steps = 0;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/state.json", ckpt);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je), *want = run_flags(t);
    json_t *flags = root ? json_object_get(root, "flags") : NULL, *js = root ? json_object_get(root, "step") : NULL;
    hp_status st = HP_OK;
    if (!root || !json_is_integer(js) || !json_is_object(flags) || !want)
        st = hp_err_set(err, HP_ERR_INPUT, "--resume: %s is not a training checkpoint's state (%s)", path,
                        root ? "no step or flags" : je.text);
    if (st == HP_OK) st = same_flags(t, ckpt, root, flags, want, saved_steps, err);
    if (st == HP_OK) st = same_model(t, ckpt, json_object_get(root, "model_config"), err);
    if (st == HP_OK) *step = (int64_t)json_integer_value(js);
    if (st == HP_OK && (*step < 1 || *step >= t->c.steps))
        st = hp_err_set(err, HP_ERR_INPUT, "--resume %s: it is at step %lld of %lld; nothing is left to train: give a "
                        "--steps above %lld to continue it (the schedule then follows the new total)", ckpt,
                        (long long)*step, (long long)t->c.steps, (long long)*step);
    json_decref(root);
    json_decref(want);
    return st;
}

/* Before a resume restores anything: every file of the checkpoint is the one its run saved, byte for byte (rank r
 * hashes its own state file, rank 0 also the model folder's two files). Collective. */
static hp_status verify_resume(const hp_comm *w, const char *ckpt, hp_err *err)
{
    char name[64];
    int me = hp_comm_rank(w);
    snprintf(name, sizeof name, "rank-%d.safetensors", me);
    hp_status st = hp_train_ckpt_verify(ckpt, name, err);
    if (st == HP_OK && me == 0) st = hp_train_ckpt_verify(ckpt, "config.json", err);
    if (st == HP_OK && me == 0) st = hp_train_ckpt_verify(ckpt, "model.safetensors", err);
    if (st != HP_OK) hp_err_prefix(err, "--resume");
    return hp_comm_agree(w, st, err);
}

/* --resume: the checkpoint's flags and model checked, its state loaded into the runner and every byte verified;
 * t->k0 its step. Collective. */
hp_status hp__trn_resume(hp_trainer *t, hp_err *err)
{
    t->sched.lr = t->to.lr; /* as run_flags records it */
    int64_t was = 0;
    hp_status st = hp_comm_agree(t->w, read_checkpoint(t, t->ckpt, &t->k0, &was, err), err);
    if (st == HP_OK && was && t->root)
        hp__trn_note(t, "--steps %lld where the run was saved with --steps %lld: the schedule of steps %lld..%lld "
                     "follows the new total (the steps before it followed the old one)", (long long)t->c.steps,
                     (long long)was, (long long)t->k0 + 1, (long long)t->c.steps);
    /* the load first: it names a tensor that is not finite; then every byte against state.json's hashes */
    if (st == HP_OK) st = hp_runner_load_train(t->r, t->ckpt, err);
    if (st == HP_OK) st = verify_resume(t->w, t->ckpt, err);
    if (st == HP_OK && t->root) hp__trn_note(t, "resumed from %s at step %lld", t->ckpt, (long long)t->k0);
    return st;
}

/* The output folder of a checkpoint, out = "<--out>/step-<t>" (inputs: the run's eight, what it must not touch). */
static hp_outdir_spec ckpt_spec(const hp_trainer *t, const char *out)
{
    return (hp_outdir_spec){.cmd = "train", .out = out, .names = hp__trn_ckpt_names, .example = "run/step-100",
                            .force = t->c.force, .inputs = t->inputs, .n_inputs = 8};
}

/* Before step 1, the checks the save of the run's last checkpoint (step `last`) will make, touching nothing: not
 * an input nor in or around one (--out inside the model's folder), absent or (--force) an earlier output. The run
 * folder may not exist yet: it is made just before step 1. */
hp_status hp__trn_check_checkpoint_out(hp_trainer *t, hp_err *err)
{
    const hp_train_config *a = &t->c;
    char out[PATH_MAX + 64];
    /* a resumed run saves after k0: a later step-<t> of its own already there would stop it at step t */
    for (int64_t s = (t->k0 / t->save_every + 1) * t->save_every; s < t->last && !a->force; s += t->save_every) {
        struct stat sb; /* the steps it saves: the multiples of --save-every after k0 (not every step up to last) */
        snprintf(out, sizeof out, "%s/step-%lld", a->out, (long long)s);
        if (stat(out, &sb) == 0)
            return hp_err_set(err, HP_ERR_INPUT, "--out %s already holds step-%lld, which this run resumed at step "
                              "%lld would save again: resume from its last checkpoint (--resume %s), or pass "
                              "--force to replace the later ones", a->out, (long long)s, (long long)t->k0, a->out);
    }
    snprintf(out, sizeof out, "%s/step-%lld", a->out, (long long)t->last);
    hp_outdir_spec os = ckpt_spec(t, out);
    os.make_parents = true;
    hp_outdir *of = NULL;
    hp_status st = hp_outdir_open(&of, &os, err);
    hp_outdir_close(of);
    return st;
}

/* Rank 0's part of a checkpoint in tmp: the model folder (params), then state.json, last: it lists every file,
 * so a folder with it is complete. */
static hp_status save_root(hp_trainer *t, const hp__trn_list *params, const char *tmp, int64_t step, hp_err *err)
{
    hp_status st = hp__trn_write_folder(t, params, NULL, tmp, err);
    if (st != HP_OK) return st;
    json_t *flags = run_flags(t);
    char *text = flags ? json_dumps(flags, JSON_PRESERVE_ORDER) : NULL;
    hp_train_ckpt_meta cm = {.run_id = t->run_id, .flags_json = text, .model_json = t->model_config,
                             .command = t->c.command ? t->c.command : "", .mesh = t->mesh};
    st = text ? hp_train_ckpt_write_state(tmp, step, t->world, &cm, err)
              : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    free(text);
    json_decref(flags);
    return st;
}

/* Checkpoint step-<t> of the run folder --out: every rank's training state, the model folder, state.json, as one
 * folder that appears whole or not at all. Collective. */
hp_status hp__trn_save_checkpoint(hp_trainer *t, int64_t step, hp_err *err)
{
    const hp_comm *w = t->w;
    bool root = t->root;
    char out[PATH_MAX + 64], tmp[PATH_MAX + 128] = "";
    snprintf(out, sizeof out, "%s/step-%lld", t->c.out, (long long)step);
    hp_outdir_spec os = ckpt_spec(t, out);
    hp_outdir *of = NULL;
    hp_status st = HP_OK;
    /* SIGINT/SIGTERM/SIGHUP during the save are recorded on every rank (mpirun forwards them; the caller's hooks):
     * the writers stop at their next piece, the save fails, its temporary folder is removed (hp_outdir_close),
     * and then the signal ends the process with its own status (T13: step-<t>.tmp.<pid> stayed behind) */
    if (t->c.signals_catch) t->c.signals_catch(t->c.ctx);
    if (root && (st = hp_outdir_open(&of, &os, err)) == HP_OK && (st = hp_outdir_begin(of, err)) == HP_OK)
        snprintf(tmp, sizeof tmp, "%s", hp_outdir_tmp(of));
    st = hp_comm_agree(w, st, err);
    if (st == HP_OK) st = hp_comm_bcast(w, tmp, sizeof tmp, 0, err);
    char sv[32];
    snprintf(sv, sizeof sv, "%lld", (long long)step);
    /* "step" is AdamW's steps taken (a skipped step takes none); "checkpoint_step" the run's step, state.json's */
    const char *const meta[4] = {"run_id", t->run_id, "checkpoint_step", sv};
    if (st == HP_OK) st = hp_runner_save_train_meta(t->r, tmp, meta, 2, err);
    hp__trn_list params = {0};
    if (st == HP_OK) st = hp_runner_gather_params(t->r, false, hp__trn_keep, &params, err);
    st = hp_comm_agree(w, st, err);
    if (st == HP_OK && root) st = save_root(t, &params, tmp, step, err);
    st = hp_comm_agree(w, st, err); /* every rank's file is in place */
    if (root && st == HP_OK) st = hp_outdir_commit(of, err);
    hp__trn_list_free(&params);
    st = hp_comm_agree(w, st, err);
    if (root && st != HP_OK) { /* a full disk, a write error: named in the checkpoint, not its temporary */
        hp_outdir_fix_msg(of, err);
        hp_err_prefix(err, "train: saving the checkpoint of step %lld failed; the earlier checkpoints are intact",
                      (long long)step);
    }
    hp_outdir_close(of); /* aborts what was not committed: the temporary folder, whoever wrote into it */
    if (st == HP_OK && root) hp__trn_note(t, "step %lld: checkpoint %s", (long long)step, out);
    if (hp_interrupted() && root)
        hp__trn_note(t, "interrupted while saving step %lld's checkpoint: %s; the earlier checkpoints are intact",
                     (long long)step, st == HP_OK ? "it was complete" : "its temporary folder is removed");
    if (t->c.signals_release) t->c.signals_release(t->c.ctx); /* a signal recorded meanwhile acts now */
    return st;
}

/* ---- the run folder ---- */

/* "step-<t>": a checkpoint's name in a run folder (decimal digits, nothing after them). */
static bool is_step_name(const char *nm)
{
    const char *num = nm + 5;
    return !strncmp(nm, "step-", 5) && *num && strspn(num, "0123456789") == strlen(num);
}

/* Removes checkpoint folder dir of another run (--force): only when it holds the output marker and nothing but
 * the files a checkpoint holds. */
static hp_status remove_checkpoint(hp_trainer *t, const char *dir, hp_err *err)
{
    char p[2 * PATH_MAX + 600];
    snprintf(p, sizeof p, "%s/%s", dir, HP_OUTDIR_MARKER);
    struct stat sb;
    if (lstat(p, &sb) != 0 || !S_ISREG(sb.st_mode))
        return hp_err_set(err, HP_ERR_INPUT, "--force: %s holds no %s, so hyperpar did not write it; it is not "
                          "removed: move it away or choose another --out", dir, HP_OUTDIR_MARKER);
    DIR *d = opendir(dir);
    if (!d) return hp_err_set(err, HP_ERR_IO, "--force: %s: cannot list it (%s)", dir, strerror(errno));
    struct dirent *e;
    hp_status st = HP_OK;
    for (int pass = 0; pass < 2 && st == HP_OK; pass++, rewinddir(d)) /* first every name checked, then removed */
        while (st == HP_OK && (e = readdir(d))) {
            const char *nm = e->d_name;
            if (!strcmp(nm, ".") || !strcmp(nm, "..")) continue;
            bool ours = !strcmp(nm, HP_OUTDIR_MARKER) || !strcmp(nm, "config.json") || !strcmp(nm, "state.json") ||
                        !strcmp(nm, "model.safetensors") ||
                        (!strncmp(nm, "rank-", 5) && strlen(nm) > 17 && !strcmp(nm + strlen(nm) - 12, ".safetensors"));
            if (!ours) st = hp_err_set(err, HP_ERR_INPUT, "--force: %s holds '%s', which hyperpar did not write; it is "
                                       "not removed", dir, nm);
            snprintf(p, sizeof p, "%s/%s", dir, nm);
            if (pass == 1 && st == HP_OK && unlink(p) != 0)
                st = hp_err_set(err, HP_ERR_IO, "--force: cannot remove %s (%s)", p, strerror(errno));
        }
    closedir(d);
    if (st == HP_OK && rmdir(dir) != 0) st = hp_err_set(err, HP_ERR_IO, "--force: cannot remove %s (%s)", dir,
                                                        strerror(errno));
    if (st == HP_OK) hp__trn_note(t, "--force: removed %s, a checkpoint of another run", dir);
    return st;
}

/* The run folder (--out with --save-every) holds the checkpoints of one run, or `merge RUN` and `--resume RUN`
 * could take another run's last step: a step-<t> of another run (any, for a new run; another run id, for a
 * resumed one) is refused, or with --force removed. Rank 0. */
static hp_status check_run_folder(hp_trainer *t, hp_err *err)
{
    const hp_train_config *a = &t->c;
    DIR *d = opendir(a->out);
    if (!d) return HP_OK; /* made at the start; a failure there was said */
    hp_status st = HP_OK;
    struct dirent *e;
    while (st == HP_OK && (e = readdir(d))) {
        if (!is_step_name(e->d_name)) continue;
        char sub[PATH_MAX + 300], id[17] = "";
        if ((size_t)snprintf(sub, sizeof sub, "%s/%s", a->out, e->d_name) >= sizeof sub) continue;
        bool known = hp_train_ckpt_run_id(sub, id, sizeof id, NULL) == HP_OK;
        if (a->resume && known && !strcmp(id, t->run_id)) continue; /* this run's own */
        if (a->force) {
            st = remove_checkpoint(t, sub, err);
            continue;
        }
        st = hp_err_set(err, HP_ERR_INPUT, "--out %s holds %s, a checkpoint of %s%s%s, and a run folder holds one "
                        "run's checkpoints (merge and --resume take its last): %s", a->out, e->d_name,
                        known ? "run " : "another run", known ? id : "", known ? (a->resume ? ", not this one" : "")
                                                                                : " (or of none: no run_id)",
                        a->resume ? "resume into the run's own folder, choose another --out, or pass --force to "
                                    "remove the other run's checkpoints"
                                  : "continue that run with --resume, choose another --out, or pass --force to remove "
                                    "its checkpoints");
    }
    closedir(d);
    return st;
}

/* A new run's id: 64 random bits as 16 hex digits (the kernel's, else the clock's and the process's). */
static void new_run_id(char out[17])
{
    uint64_t v = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&v, sizeof v, 1, f) != 1) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
    }
    if (f) fclose(f);
    snprintf(out, 17, "%016llx", (unsigned long long)v);
}

/* What binds this run's checkpoints (with --save-every or --resume): the run id (the resumed checkpoint's, else a
 * new one), the data's identity (the size and XXH64 of its bytes, read by rank 0) and the model's config; then
 * the run folder's other runs (check_run_folder). Collective. */
hp_status hp__trn_bind_start(hp_trainer *t, hp_err *err)
{
    const hp_train_config *a = &t->c;
    const hp_comm *w = t->w;
    hp_status st = HP_OK;
    const char *dp = a->data ? a->data : a->input;
    if (t->root) {
        if (a->resume) st = hp_train_ckpt_run_id(t->ckpt, t->run_id, sizeof t->run_id, err);
        else new_run_id(t->run_id);
        uint64_t h = 0; /* --text's identity is its token stream's, hashed when it was made */
        if (st == HP_OK && !a->text) st = hp_train_file_sum(dp, &t->data_bytes, &h, err);
        if (!a->text) snprintf(t->data_sum, sizeof t->data_sum, "%016llx", (unsigned long long)h);
        if (st == HP_OK && t->save_every) st = check_run_folder(t, err);
    }
    st = hp_comm_agree(w, st, err);
    if (st == HP_OK) st = hp_comm_bcast(w, t->run_id, sizeof t->run_id, 0, err);
    if (st == HP_OK) st = hp_comm_bcast(w, t->data_sum, sizeof t->data_sum, 0, err);
    if (st == HP_OK) st = hp_comm_bcast(w, &t->data_bytes, sizeof t->data_bytes, 0, err);
    char cfg[PATH_MAX + 16];
    snprintf(cfg, sizeof cfg, "%s/config.json", t->m->ckpt ? hp_ckpt_dir(t->m->ckpt) : a->model);
    if (st == HP_OK) st = t->m->has_config ? hp_train_model_config(cfg, &t->model_config, err)
                                           : ((t->model_config = strdup("{}")) ? HP_OK
                                              : hp_err_set(err, HP_ERR_NOMEM, "out of memory"));
    return hp_comm_agree(w, st, err);
}
