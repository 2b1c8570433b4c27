"""`rmscore bench`: repeated independent runs against fresh servers, with intervals, a report and plots."""
