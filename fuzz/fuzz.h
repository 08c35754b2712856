/*
 * fuzz.h — the one entry point every fuzz target defines (libFuzzer's, also called by replay_main.c).
 */
#ifndef HP_FUZZ_H
#define HP_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
