/* Learning-rate schedule: TorchTitan's linear_warmup_stable_decay LambdaLR factor
 * (torchtitan/components/lr_scheduler.py), including its clamps and the virtual last step
 * that keeps the final step's learning rate above zero. */
#include <math.h>
#include <strings.h>

#include "hyperparallel/optim.h"

static const char *decay_names[] = {"linear", "sqrt", "cosine"};

const char *hp_lr_decay_name(hp_lr_decay_t d) {
    return (d >= HP_LR_DECAY_LINEAR && d <= HP_LR_DECAY_COSINE) ? decay_names[d] : "?";
}

hp_status_t hp_lr_decay_from_name(const char *name, hp_lr_decay_t *out) {
    for (int i = 0; i < 3; i++)
        if (strcasecmp(name, decay_names[i]) == 0) {
            *out = (hp_lr_decay_t)i;
            return HP_OK;
        }
    return hp_error(HP_ERR_INVALID_ARG, "lr decay type '%s' is unknown; expected linear, sqrt or cosine", name);
}

hp_status_t hp_lr_schedule_init(hp_lr_schedule_t *s, int64_t training_steps, int64_t warmup_steps,
                                double decay_ratio, hp_lr_decay_t decay, double min_lr_factor) {
    if (training_steps < 1 || warmup_steps < 0)
        return hp_error(HP_ERR_INVALID_ARG, "lr schedule: training steps %lld must be >= 1 and warmup "
                        "steps %lld >= 0", (long long)training_steps, (long long)warmup_steps);
    if (decay < HP_LR_DECAY_LINEAR || decay > HP_LR_DECAY_COSINE)
        return hp_error(HP_ERR_INVALID_ARG, "lr schedule: decay type %d is not linear/sqrt/cosine", (int)decay);
    if (!(min_lr_factor >= 0 && min_lr_factor <= 1))
        return hp_error(HP_ERR_INVALID_ARG, "lr schedule: min_lr_factor %g must be in [0, 1]", min_lr_factor);
    if (decay_ratio > 1 || isnan(decay_ratio))
        return hp_error(HP_ERR_INVALID_ARG, "lr schedule: decay_ratio %g must be in [0, 1] (or < 0 for "
                        "'decay over all steps after warmup')", decay_ratio);
    if (warmup_steps > training_steps) {
        hp_log(HP_LOG_WARN, "warmup steps (%lld) exceed total training steps (%lld); adjusting warmup "
               "steps to %lld", (long long)warmup_steps, (long long)training_steps,
               (long long)training_steps);
        warmup_steps = training_steps;
    }
    int64_t decay_steps;
    if (decay_ratio >= 0) {
        /* Python's round() rounds half to even, as nearbyint in the default rounding mode */
        decay_steps = (int64_t)nearbyint((double)training_steps * decay_ratio);
        if (warmup_steps + decay_steps > training_steps) {
            hp_log(HP_LOG_WARN, "warmup (%lld) + decay (%lld) steps exceed total training steps "
                   "(%lld); adjusting decay steps to %lld", (long long)warmup_steps,
                   (long long)decay_steps, (long long)training_steps,
                   (long long)(training_steps - warmup_steps));
            decay_steps = training_steps - warmup_steps;
        }
    } else {
        decay_steps = training_steps - warmup_steps;
    }
    s->warmup_steps = warmup_steps;
    s->decay_steps = decay_steps;
    s->stable_steps = training_steps + 1 - warmup_steps - decay_steps;
    s->decay = decay;
    s->min_lr_factor = min_lr_factor;
    return HP_OK;
}

double hp_lr_schedule_factor(const hp_lr_schedule_t *s, int64_t step) {
    int64_t warmup_stable = s->warmup_steps + s->stable_steps;
    if (step < s->warmup_steps) return (double)(step + 1) / (double)s->warmup_steps;
    if (step < warmup_stable || s->decay_steps == 0) return 1.0;
    double progress = (double)(step + 1 - warmup_stable) / (double)s->decay_steps;
    if (progress > 1) progress = 1;   /* past the last step TorchTitan's value is undefined; hold */
    double f;
    switch (s->decay) {
    case HP_LR_DECAY_LINEAR: f = 1.0 - progress; break;
    case HP_LR_DECAY_SQRT: f = 1.0 - sqrt(progress); break;
    default: f = 0.5 * (1.0 + cos(M_PI * progress)); break;
    }
    return s->min_lr_factor + (1.0 - s->min_lr_factor) * f;
}
