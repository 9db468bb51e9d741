"""mLSTMsig public function (being written)."""


def mlstm_sig(*args, **kwargs):
    raise NotImplementedError("tfla.mlstm_sig is being written")
