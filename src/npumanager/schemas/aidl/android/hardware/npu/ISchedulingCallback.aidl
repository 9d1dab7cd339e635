// The driver's report of each piece of work's life.
package android.hardware.npu;

import android.hardware.npu.EndReason;
import android.hardware.npu.StartReason;
import android.hardware.npu.WorkInfo;

@VintfStability
oneway interface ISchedulingCallback {
    const int DEBOUNCE_DURATION_MS = 50;

    void onWorkRequested(in WorkInfo info);
    void onWorkStarted(in WorkInfo info, StartReason reason);
    void onWorkEnded(in WorkInfo info, EndReason reason);
}
