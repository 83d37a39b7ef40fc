/*
 * ttrace.h: the optional C API of libttrace.so.
 *
 * A program traced with `ttrace run` (libttrace.so preloaded) may mark training steps and
 * pause or resume capture. Nothing here is needed for tracing: the default step rule needs no
 * code change (docs/format.md, "Step numbering").
 *
 *   ttrace_step()    starts a new step when the run uses TTRACE_STEP_RULE=api
 *                    (`ttrace run --step-rule api`); ignored under the other rules.
 *   ttrace_pause()   stops capturing (NVTX ranges, NCCL groups and communicators are still
 *                    tracked, so resuming inside an NCCL group stays correct).
 *   ttrace_resume()  captures again what the run's configuration selects.
 *
 * The functions are safe to call from any thread at any time, traced or not.
 *
 * Linking: the symbols come from libttrace.so, which is only present when the program runs
 * under ttrace. Either link with -lttrace, or use the TTRACE_STEP()/TTRACE_PAUSE()/
 * TTRACE_RESUME() macros, which call the functions through weak references and do nothing
 * when the library is not loaded (GCC and Clang, ELF platforms).
 */
#ifndef TTRACE_H
#define TTRACE_H

#ifdef __cplusplus
extern "C" {
#endif

void ttrace_step(void);
void ttrace_pause(void);
void ttrace_resume(void);

#if defined(__GNUC__) || defined(__clang__)
#pragma weak ttrace_step
#pragma weak ttrace_pause
#pragma weak ttrace_resume
/* Calls through the weak references: no-ops when libttrace.so is not loaded. */
#define TTRACE_STEP()                                                                          \
    do {                                                                                       \
        if (ttrace_step) ttrace_step();                                                        \
    } while (0)
#define TTRACE_PAUSE()                                                                         \
    do {                                                                                       \
        if (ttrace_pause) ttrace_pause();                                                      \
    } while (0)
#define TTRACE_RESUME()                                                                        \
    do {                                                                                       \
        if (ttrace_resume) ttrace_resume();                                                    \
    } while (0)
#endif

#ifdef __cplusplus
}
#endif

#endif /* TTRACE_H */
