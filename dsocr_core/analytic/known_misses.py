"""Where the time model's prediction is known to miss: the accuracy measured in docs/accuracy.md (held-out points on
an H200 and an H100, both session modes), turned into the sentences a page shows beside a prediction that falls
outside the targets (median error <= 15% per stage). A prediction drawn without them reads as if it were as good in
every mode, stage and batch as in the fast mode at batch 1, which it is not."""
from __future__ import annotations

from collections.abc import Iterable

from .predict import timing_table  # the prediction's own choice of table

DOC = "docs/accuracy.md"
QUICK = ("its tables are the quick grids (kernel shapes up to 128 wide, a smoke test of the calibration): every "
         "kernel of the model lies beyond them and takes the edge value, so the predicted times miss by 10x or more "
         "(on a 2-core CPU: LM prefill 10-15 s predicted against 0.6-3.1 s measured). It tests the calibration; "
         "it does not predict (a GPU profile measured with the full grids does)")
CPU = ("it is a CPU profile, and the time model's accuracy was measured on GPUs only (the plans price a GPU's "
       "kernels and launches): its predictions are untested")
DERIVED = ("it is DERIVED (scaled from another GPU's tables): on 18 held-out H100 sets predicted from the H200's "
           "profile, TTFT misses by 0.9-4.7% (median), TPOT by 2.2-6.8%, the LM prefill by up to 12%, the projector "
           "by 2-26% (under); on 25 H200 sets from the H100's, TPOT 1.4-8.9%, the LM prefill up to 23%, CLIP up to "
           "10.5%; a what-if SM clock cannot move its tables (it records no calibration clock)")
REFERENCE = ("the reference session mode misses its targets (median 10%, max 25% per stage) in the projector on "
             "every set, and in the LM prefill and TTFT with another machine's host costs. With the machine's own "
             "host costs (calibrate --tables launch.host_kinds,launch.host_stages) it met the others in one of two "
             "H200 random sets (2026-11-28, seed 99, held out: TTFT 2%, the LM prefill 4%, SAM 5%, CLIP 4%, vision "
             "5%, decode 9%, TPOT 9%, single steps up to 33% off, the projector 28% under); in the other (seed 101) "
             "the host ran in a slow spell and the LM prefill was 16% and the decode step 18% under. DeepSeek-OCR 2 "
             "(seed 100, seed 99's profile): TTFT 5%, the LM prefill 7%, the encoder 6%, decode "
             "7%, TPOT 6%, the projector 48% under. It is host-bound at small batches and its host differs between "
             "machines of the same kind by up to 1.5x: with another H200's host costs (the shipped profile) the LM "
             "prefill is 17-19% and TTFT 9-13% under (both models); with another machine's costs (the bundled H200 "
             "run: SAM, CLIP and vision 22-37% over) errors of 20-50% are usual; the H100's profiles, which measured "
             "no host cost of a view, leave its LM prefill 5-32% under; its host-bound stages also vary by up to "
             "+-50% between runs of the same point. The projector (a few ops per image, its first part's code run "
             "cold) is under-predicted by 27-48% on every set")
BATCHED = ("batch > 1: decode is over-predicted under the assumed uniform routing (synthetic weights route a batch's "
           "tokens to 8-10 distinct experts, the model assumes 21-64): fast TPOT +32% to +58% (median); predicted "
           "with a run's observed routing, 2-12% on the H100 and the H200 (the H200's held-out sets of 2026-11-28, "
           "seeds 85-92: TPOT 0.9-6.0% median, max 14%; the H100's of 2026-11-27 and 28, seeds 68-75: 1.7-2.8%, "
           "max 11%); reference up to +729%")
BATCHED_PREFILL = ("batch > 1 in the fast mode: the same batched LM prefill measured 10-22% slower on one H100 "
                   "machine than on another (the same code and points, 2026-11-27; SAM, CLIP and decode within 3%), "
                   "so a measured batched prefill can take that much longer than predicted; on the other machines the "
                   "held-out sets were within 4.2% (median, max 10%; 2.5%, max 9.7%, on the latest). An H200 at its "
                   "700 W cap runs large batches' CLIP and LM prefill as low as 1,600 MHz instead of the tables' 1,980: "
                   "a what-if prediction (at the full clock) of batch 16-64 is 5-11% fast there (2026-11-28, seeds 80-"
                   "82: LM prefill 5.7-10.0% median, CLIP 5.4-8.0%, the decode step 3-10%); a measured point is "
                   "predicted at the clocks its stages ran at (seeds 80-84: LM prefill 2.0-4.1%, CLIP 2.3-6.1%, TPOT "
                   "0.7-4.5%, median); a what-if SM clock (the sidebar's, analytic --sm-clock) prices a capped clock")
EXPERT_TILE = ("batch 17-64 in the fast mode: the decode step is under-predicted, by 6% (median) at batch 17-32 and "
               "11% at 33-64 on the H200's held-out sets with the greedy choice in the step's graph (2026-11-28, seeds "
               "85-88; up to 15% on single points), because this profile timed the by-expert MoE kernels at a token "
               "tile of 16 while those batches run tiles of 32 and 64 (the prediction's notes say which table; "
               "calibrate --tables memory.moe_gemv_combine,memory.moe_gemv --add-to PROFILE measures the tiles)")
SPLIT_KV_FILL = ("batch > 1 in the fast mode: the decode step is under-predicted at short contexts, because this "
                 "profile timed the split-KV decode attention with its static cache ending at the position, while the "
                 "engine's cache runs on to the end of a 256-slot bucket and the kernel's grid covers all of it: the "
                 "H200's sets of 2026-11-28 (seeds 85-90), predicted with the by-tile MoE tables, had the decode step "
                 "2.0-6.7% under (median per set; up to 12% on single points, at batch 29-57 with short texts), "
                 "1.1-3.4% with the table measured by fill (measured after those sets; calibrate --tables "
                 "attention.split_kv --add-to PROFILE measures it)")
PROJECTOR = ("the projector (0.015-1.7 ms) is under-predicted: on the latest held-out sets (2026-11-27 and 28) by "
             "2-10% (median) on the H200 and 8-14% on the H100, up to 44% on single points; at batch 1 with long texts 8% "
             "over (H200). Its kernels are priced within a few percent at small batches and 3-16% under at 8,000-"
             "19,000 feature rows (traced on an H100, 2026-11-28); the rest is time the measured stage holds beyond "
             "its kernels, up to 65 us, which depends on the GPU's state after SAM and CLIP (the same page's stage took "
             "192-270 us on one H100; not the stage timer's synchronisation, which changed it by at most 2.2% on an H200) "
             "and which the model has no term for")


def known_misses(profile, session_mode: str, max_batch: int = 1,
                 stages: Iterable[str] | None = None) -> list[str]:
    """The documented misses that apply to a prediction with `profile` (calibration.profile.Profile) in
    `session_mode`, over points up to `max_batch` and showing `stages` (None: all). Empty where the prediction is
    within the documented accuracy."""
    shown = None if stages is None else set(stages)
    out = []
    if profile.quick:
        out.append(QUICK)
    elif profile.device.get("kind") == "cpu":
        out.append(CPU)
    if profile.derived:
        out.append(DERIVED)
    if session_mode == "reference":
        out.append(REFERENCE)
    if max_batch > 1 and (shown is None or shown & {"decode", "decode_step", "tpot", "TPOT", "LM decode"}):
        out.append(BATCHED)
    decode_shown = shown is None or bool(shown & {"decode", "decode_step", "tpot", "TPOT", "LM decode"})
    if session_mode == "fast" and max_batch > 16 and decode_shown and _axis_untimed(profile, "memory.moe_gemv_combine",
                                                                                    "tokens"):
        out.append(EXPERT_TILE)
    if session_mode == "fast" and max_batch > 1 and decode_shown and _axis_untimed(profile, "attention.split_kv",
                                                                                   "fill"):
        out.append(SPLIT_KV_FILL)
    if session_mode == "fast" and max_batch > 1 and (shown is None or shown & {"prefill", "LM prefill", "ttft",
                                                                                 "TTFT"}):
        out.append(BATCHED_PREFILL)
    if session_mode == "fast" and (shown is None or "projector" in shown):
        out.append(PROJECTOR)
    return out


def _axis_untimed(profile, kind: str, axis: str) -> bool:
    """The table the default fast engine's kernel kind `kind` is priced on (fast/plan.py, or the fallback the profile
    has) was measured before it had `axis` (calibration/profile.EXTRA_AXES): the by-expert MoE kernels' token tile,
    the split-KV attention's fill."""
    found = timing_table(profile, kind, "bfloat16")
    return found is not None and axis in found[0].meta.get("axes_added", {})
