// SPDX-License-Identifier: Apache-2.0
// settled's multi-transfer contract: one transaction pays many recipients
// of one ERC-20 from the caller's balance (the caller approves this
// contract once). All or nothing: one failed transfer reverts the whole
// transaction, and settled splits the batch to find it.
pragma solidity ^0.8.20;

contract PayMany {
    /// Transfer number `index` of a batch failed (reverted, returned false,
    /// or the token has no code).
    error TransferFailed(uint256 index);
    /// The recipients and the amounts differ in number.
    error LengthMismatch();

    /// Pays `amounts[i]` of `token` to `recipients[i]` for every i, from
    /// the caller, through `transferFrom`. A token that returns no value
    /// is taken at its revert-or-not, as SafeERC20 does.
    function pay(address token, address[] calldata recipients, uint256[] calldata amounts) external {
        if (recipients.length != amounts.length) revert LengthMismatch();
        bool hasCode = token.code.length > 0;
        for (uint256 i = 0; i < recipients.length; ++i) {
            (bool ok, bytes memory answer) = token.call(
                abi.encodeWithSelector(0x23b872dd, msg.sender, recipients[i], amounts[i])
            );
            if (!ok || !hasCode || (answer.length != 0 && !abi.decode(answer, (bool)))) {
                revert TransferFailed(i);
            }
        }
    }
}
