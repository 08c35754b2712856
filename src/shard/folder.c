/*
 * folder.c — what a shard folder records of the plan it was written with, for the commands that run it.
 *
 *   DIR/manifest.json  mesh {dims, world, ep, ep_mode}, plan {fingerprint, stored: "plan.json"}
 *   DIR/plan.json      the plan's JSON text as `hyperpar shard` used it (its --plan file, or the plan it derived)
 *
 * A folder remembers its mesh, its placements and its EP compute, so `run DIR` needs no plan flags. Folders
 * written before plan.json was stored record only the mesh: the caller derives the plan on it. plan.json is
 * held to the manifest's fingerprint, so an edit after sharding is named as such, never run.
 */
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "shard/shard_int.h"

hp_status hp_shard_folder_plan(hp_plan **plan, hp_mesh *mesh, const hp_model *m, const char *dir, hp_err *err)
{
    *plan = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    hp__manifest *man = NULL;
    hp_status st = hp__manifest_read(path, &man, err);
    if (st != HP_OK) return st;
    if (!man->has_mesh) {
        hp__manifest_free(man);
        return hp_err_set(err, HP_ERR_INPUT, "%s records no mesh.dims; the folder is not a complete hyperpar shard "
                          "output (re-run 'hyperpar shard')", path);
    }
    if (mesh) *mesh = man->mesh;
    if (!man->plan_stored) { /* an older folder: the mesh is all it records */
        hp__manifest_free(man);
        return HP_OK;
    }
    snprintf(path, sizeof path, "%s/" HP__SHARD_PLAN_FILE, dir);
    char *text = NULL, fp[17];
    size_t len = 0;
    if (!hp__file_exists(path))
        st = hp_err_set(err, HP_ERR_INPUT, "%s is missing: the folder's manifest.json records its plan there; the "
                        "folder is incomplete (shard it again)", path);
    if (st == HP_OK) st = hp__read_file(path, HP_JSON_MAX_FILE, &text, &len, err);
    if (st == HP_OK && strcmp(hp__fnv1a_hex(text, len, fp), man->plan_fp) != 0)
        st = hp_err_set(err, HP_ERR_INPUT, "%s changed after sharding (fingerprint %s; manifest.json records %s): "
                        "the rank files were written for the plan it held then; shard again with the new plan", path,
                        fp, man->plan_fp);
    if (st == HP_OK) st = hp__shard_plan_parse(plan, m, text, len, path, err);
    free(text);
    hp__manifest_free(man);
    return st;
}
