/*
 * ops.c — one record per op of the program (exec/prog.h): how the runtime loads, executes, registers for training
 * and differentiates each op. The runner's forward, parameter registration and the backward all walk the program's
 * steps and call these entries; nothing else dispatches on an op. The static facts of an op (its local dims, the
 * buffers it sizes) are the program's (exec/prog.c); its dry walk (bytes, FLOPs, collectives) is cost's.
 */
#include "run/runner_int.h"

const hp__op_rt hp__op_rt_table[HP__OP_COUNT] = {
    [HP__OP_EMBED] = {hp__load_embed, hp__fwd_embed, hp__reg_table, hp__bwd_embed},
    [HP__OP_NORM] = {hp__load_norm, hp__fwd_norm, hp__reg_params, hp__bwd_norm},
    [HP__OP_ATTN] = {hp__load_attn, hp__fwd_attn, hp__reg_params, hp__bwd_attn},
    [HP__OP_MLA] = {hp__load_attn, hp__fwd_attn, hp__reg_params, hp__bwd_attn},
    [HP__OP_MLP] = {hp__load_mlp, hp__fwd_mlp, hp__reg_params, hp__bwd_mlp},
    [HP__OP_MOE] = {hp__load_moe, hp__fwd_moe, hp__reg_moe, hp__bwd_moe},
    [HP__OP_RESIDUAL] = {NULL, hp__fwd_residual, NULL, hp__bwd_residual},
    [HP__OP_HEAD] = {hp__load_head, hp__fwd_head, hp__reg_table, hp__bwd_head},
    [HP__OP_LOSS] = {NULL, hp__fwd_loss, NULL, hp__bwd_loss},
};
